//! fastcp: fast, secure file copy over SSH, as a library.
//!
//! This facade is what the `fastcp` command is built on, and what an embedding program uses:
//!
//! - [`Location`] parses scp-style operands (`file`, `host:path`, `user@host:path`).
//! - [`Plan`] checks a copy's operands and [`CopyOptions`]; [`copy_local`] runs a local copy
//!   through the engine.
//! - [`copy_remote`] runs a copy to, from or between remote hosts over SSH (starting
//!   `fastcp server` there, uploading it or going over [`sftp`] where it is missing);
//!   [`Session`] logs in once for any number of such copies; [`blocking`] has both for
//!   synchronous programs.
//! - [`run_session`] drives a remote copy over a transport's control stream
//!   ([`run_session_inline`] over that stream alone), and [`server::serve`] is the remote
//!   side (`fastcp server`).
//! - [`probe`] asks a remote host which fastcp it runs and what a copy would choose;
//!   [`measure`] times the transport to it without touching a disk (`fastcp doctor`).
//! - [`data::send`] and [`data::receive`] run the engine over a session's streams, sealing
//!   and opening TCP records in place.
//! - [`CopyOptions`] also carry a dry run, zstd compression ([`compress`]), a bandwidth limit
//!   ([`limit`]) and a [`Log`] for the steps a copy takes.
//! - The building blocks are re-exported: [`proto`] (the wire format), [`crypto`] (ciphers,
//!   the CPU probe, the key schedule), [`transport`] (SSH and TCP streams) and [`stream`] (the
//!   parallel chunked copy engine).
//!
//! # Example
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), fastcp::Error> {
//! use std::sync::Arc;
//! use fastcp::{CopyOptions, Location, Plan, Progress};
//!
//! let dir = tempfile::tempdir()?;
//! std::fs::write(dir.path().join("a.txt"), b"hello")?;
//! let plan = Plan::new(
//!     vec![Location::Local(dir.path().join("a.txt"))],
//!     Location::Local(dir.path().join("b.txt")),
//!     CopyOptions::default(),
//! )?;
//! let outcome = fastcp::copy_local(&plan, Arc::new(Progress::default())).await?;
//! assert_eq!(outcome.report.local.files, 1);
//! assert_eq!(std::fs::read(dir.path().join("b.txt"))?, b"hello");
//! # Ok(()) }
//! ```
#![deny(missing_docs)]

pub mod blocking;
mod client;
pub mod compress;
pub mod data;
pub mod deploy;
mod dry_run;
mod error;
pub mod limit;
mod location;
mod log;
mod relay;
mod remote;
mod remote_hash;
pub mod server;
mod session;
pub mod sftp;
pub mod shard;
pub mod stdio;
mod wire;

pub use client::{
    CopyOptions, DEFAULT_SSH_STREAMS, DEFAULT_TCP_STREAMS, DEFAULT_TIMEOUT, MAX_SSH_STREAMS,
    Measurement, Mode, Outcome, Plan, Probe, SessionDone, TransportChoice, TransportUsed,
    copy_local, copy_remote, measure, probe, run_session, run_session_inline,
};
pub use dry_run::Listed;
pub use error::{Error, ErrorKind, Fault, exit};
pub use location::{Location, RemotePath};
pub use log::{Log, LogLevel};
pub use remote::Session;
pub use session::SOFTWARE;
pub use wire::Prefixed;

pub use fastcp_crypto as crypto;
pub use fastcp_proto as proto;
pub use fastcp_stream as stream;
pub use fastcp_stream::{Event, EventSink, KeepAttrs, Progress, Report, SkipReason};
pub use fastcp_transport as transport;

pub use fastcp_transport::{BoxStream, Duplex};
pub use tokio_util::sync::CancellationToken;

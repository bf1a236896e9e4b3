//! SSH: the built-in client on russh ([`SshSession`]) and the system OpenSSH client
//! ([`SshProgram`]), with ssh_config resolution and known_hosts checking.

mod auth;
pub mod client;
pub mod config;
mod error;
mod keywords;
pub mod known_hosts;
pub mod program;
mod quickack;
pub mod remote;
pub mod stream;

pub use auth::{Prompt, Question, QuestionKind};
pub use client::{SshClientConfig, SshSession};
pub use config::{
    AddressFamily, HostConfig, SshConfigFile, SshOptions, StrictHostKeyChecking, resolve_chain,
};
pub use error::{Error, HostKeyRefusal};
pub use program::{ProcessStream, SshProgram};
pub use remote::{ExitStatus, ExitWaiter, RemoteProcess, Stderr, server_command, shell_quote};
pub use stream::SshStream;

//! The copy calls for programs without an async runtime, as reqwest's `blocking` module: each
//! call runs to its end on a runtime this module owns (started on first use, shared by every
//! call), and returns the same [`Outcome`] and [`Error`] as the async calls.
//!
//! Do not call these from inside an async runtime (they would block one of its threads);
//! use the async [`crate::copy_local`] and [`crate::copy_remote`] there.
//!
//! ```
//! use std::sync::Arc;
//! use fastcp::{CopyOptions, Location, Plan, Progress};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = tempfile::tempdir()?;
//! std::fs::write(dir.path().join("a.txt"), b"hello")?;
//! let plan = Plan::new(
//!     vec![Location::Local(dir.path().join("a.txt"))],
//!     Location::Local(dir.path().join("b.txt")),
//!     CopyOptions::default(),
//! )?;
//! let outcome = fastcp::blocking::copy_local(&plan, Arc::new(Progress::default()))?;
//! assert!(outcome.report.is_complete());
//! assert_eq!(std::fs::read(dir.path().join("b.txt"))?, b"hello");
//! # Ok(())
//! # }
//! ```

use std::sync::{Arc, OnceLock};

use fastcp_transport::SshOptions;

use crate::{Error, Outcome, Plan, Progress};

/// The runtime every blocking call runs on.
fn runtime() -> Result<&'static tokio::runtime::Runtime, Error> {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    if let Some(rt) = RUNTIME.get() {
        return Ok(rt);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("fastcp")
        .build()?;
    Ok(RUNTIME.get_or_init(|| rt))
}

/// [`crate::copy_local`], blocking until it is done.
pub fn copy_local(plan: &Plan, progress: Arc<Progress>) -> Result<Outcome, Error> {
    runtime()?.block_on(crate::copy_local(plan, progress))
}

/// [`crate::copy_remote`], blocking until it is done.
pub fn copy_remote(
    plan: &Plan,
    ssh: &SshOptions,
    progress: Arc<Progress>,
) -> Result<Outcome, Error> {
    runtime()?.block_on(crate::copy_remote(plan, ssh, progress))
}

/// [`crate::Session`], with blocking calls: one login for many copies.
#[derive(Debug)]
pub struct Session {
    inner: crate::Session,
}

impl Session {
    /// [`crate::Session::connect`], blocking until logged in.
    pub fn connect(
        remote: &crate::RemotePath,
        ssh: &SshOptions,
        options: &crate::CopyOptions,
    ) -> Result<Session, Error> {
        let inner = runtime()?.block_on(crate::Session::connect(remote, ssh, options))?;
        Ok(Session { inner })
    }

    /// [`crate::Session::copy`], blocking until it is done. Copies from several threads run
    /// at the same time over the one login.
    pub fn copy(&self, plan: &Plan, progress: Arc<Progress>) -> Result<Outcome, Error> {
        runtime()?.block_on(self.inner.copy(plan, progress))
    }

    /// [`crate::Session::close`].
    pub fn close(self) -> Result<(), Error> {
        runtime()?.block_on(self.inner.close());
        Ok(())
    }
}

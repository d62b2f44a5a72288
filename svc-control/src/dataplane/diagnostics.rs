//! The programs' diagnostics (aya-log): the level they write at, and svcd's reader that
//! forwards them into its tracing log.

pub use crate::config::host::LogLevel;

/// The programs' diagnostics into svcd's tracing log (target `svc::fence`).
#[derive(Debug, Clone, Copy, Default)]
pub struct TracingLog;

impl log::Log for TracingLog {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        let message = record.args();
        match record.level() {
            log::Level::Error => tracing::error!(target: "svc::fence", "{message}"),
            log::Level::Warn => tracing::warn!(target: "svc::fence", "{message}"),
            log::Level::Info => tracing::info!(target: "svc::fence", "{message}"),
            log::Level::Debug => tracing::debug!(target: "svc::fence", "{message}"),
            log::Level::Trace => tracing::trace!(target: "svc::fence", "{message}"),
        }
    }

    fn flush(&self) {}
}

/// Forward `logger`'s records as they come, until the task is dropped.
pub async fn tracing_log(logger: aya_log::EbpfLogger<TracingLog>) {
    // SAFETY: the logger owns its ring buffer's map fd, which stays open and the same for as
    // long as the logger lives, and the AsyncFd owns the logger.
    let registered = unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(logger, tokio::io::Interest::READABLE)
    };
    let mut fd = match registered {
        Ok(fd) => fd,
        Err(e) => {
            tracing::warn!(error = %e, "the fence's diagnostics cannot be read");
            return;
        }
    };
    loop {
        match fd.readable_mut().await {
            Ok(mut ready) => {
                ready.get_inner_mut().flush();
                ready.clear_ready();
            }
            Err(e) => {
                tracing::warn!(error = %e, "reading the fence's diagnostics");
                return;
            }
        }
    }
}

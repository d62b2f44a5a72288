//! Background tasks tied to what owns them.

/// A background task that ends when this is dropped.
#[derive(Debug)]
pub(super) struct TaskGuard(pub(super) tokio::task::AbortHandle);

impl Drop for TaskGuard {
    fn drop(&mut self) {
        self.0.abort();
    }
}

//! What the agent keeps of the host's streams: each open stream's input, credit, process and
//! terminal, and where its frames go ([`Out`]: to the host that opened it, nowhere once
//! another host took over).

use std::{
    collections::HashMap,
    os::fd::OwnedFd,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

use tokio::sync::{Semaphore, mpsc};

use crate::proto::{Frame, Kind};

/// What the agent knows of one open stream, for the frames that follow its `Open`.
pub(super) struct StreamIn {
    /// Standard input or file content (`None` = end of file).
    pub input: Option<mpsc::UnboundedSender<Option<Vec<u8>>>>,
    /// Credit for what the agent sends on this stream.
    pub credit: Arc<Semaphore>,
    /// The command's process (for signals, and to kill it when the host goes away).
    pub pid: Option<i32>,
    /// The command's terminal (for resizes).
    pub tty: Option<Arc<OwnedFd>>,
    /// A held command's gate, until the host says `Go` or `Cancel` (dropped with the stream:
    /// the command is then discarded).
    pub gate: Option<super::start::Gate>,
}

pub(super) type Streams = Arc<Mutex<HashMap<u32, StreamIn>>>;

/// The open streams, whatever a panicking holder left.
pub(super) fn lock(s: &Streams) -> std::sync::MutexGuard<'_, HashMap<u32, StreamIn>> {
    s.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Where a stream's frames go: to the host it was opened by, and nowhere once another host
/// took over the channel.
#[derive(Clone)]
pub(super) struct Out {
    pub tx: mpsc::UnboundedSender<(u64, Frame)>,
    /// The host this sender is for.
    pub epoch: u64,
    /// The host being served now.
    pub current: Arc<AtomicU64>,
}

impl Out {
    /// Send `frame` to the host this is for (dropped if another took over).
    pub(super) fn send(&self, frame: Frame) -> Result<(), ()> {
        self.tx.send((self.epoch, frame)).map_err(|_| ())
    }

    /// A sender for the next host to take the channel over.
    pub(super) fn next_host(&self) -> Self {
        let epoch = self.current.fetch_add(1, Ordering::AcqRel) + 1;
        Self {
            tx: self.tx.clone(),
            epoch,
            current: self.current.clone(),
        }
    }
}

/// An error answer on stream `id`.
pub(super) fn error(id: u32, message: String) -> Frame {
    Frame::new(id, Kind::Error, message)
}

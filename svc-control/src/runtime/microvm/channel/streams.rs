//! The host-opened streams of a channel, as the reading side routes the agent's frames to
//! them and a caller reads them: what each stream has heard, its credit and its unread count.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, atomic::AtomicU32},
};

use svc_guest::proto::Frame;
use tokio::sync::{Semaphore, mpsc, watch};

/// What the guest sent on one stream.
pub(super) enum Event {
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    Exit(i32),
    Error(String),
}

/// The host's record of an open stream.
pub(super) struct StreamOut {
    pub events: mpsc::UnboundedSender<Event>,
    /// Credit the guest gave for what the host sends (standard input, file content).
    pub credit: Arc<Semaphore>,
    /// Bytes the guest sent that the host has not yet handed on (and credited back).
    pub unread: Arc<AtomicU32>,
}

pub(super) type Streams = Arc<Mutex<HashMap<u32, StreamOut>>>;

/// A stream just opened: what the host needs to send on it and to hear from it.
pub(super) struct Opened {
    pub id: u32,
    pub events: mpsc::UnboundedReceiver<Event>,
    pub credit: Arc<Semaphore>,
    pub unread: Arc<AtomicU32>,
    pub ended: watch::Receiver<Option<String>>,
    pub out: mpsc::UnboundedSender<Frame>,
}

/// The open streams, whatever a panicking holder left.
pub(super) fn lock(s: &Streams) -> std::sync::MutexGuard<'_, HashMap<u32, StreamOut>> {
    s.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

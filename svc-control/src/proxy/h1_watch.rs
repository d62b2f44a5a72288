//! The guest's side of an HTTP/1.1 connection as hyper reads it: through the framing witness
//! ([`Tracker`]), which hands on only what it has read, and under the head's time: a head begun
//! and not complete within `header_timeout` is refused (408, the perimeter's answer) and the
//! connection dropped. hyper's own header timer cannot see a head the witness still holds.

use std::{
    future::Future,
    io,
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::h1_frames::Tracker;

/// A stream whose reads go through a [`Tracker`] (HTTP/1.1 connections only; `None`: read as
/// it is).
pub struct Watched<S> {
    inner: S,
    tracker: Option<Tracker>,
    /// Bytes the tracker handed on that hyper has not read yet.
    ready: Vec<u8>,
    header_timeout: Duration,
    /// When the head being read (which one) runs out of time.
    deadline: Option<(u64, Pin<Box<tokio::time::Sleep>>)>,
}

impl<S> Watched<S> {
    /// `inner`, read through `tracker` if there is one, each head within `header_timeout`.
    pub fn new(inner: S, tracker: Option<Tracker>, header_timeout: Duration) -> Self {
        Self {
            inner,
            tracker,
            ready: Vec::new(),
            header_timeout,
            deadline: None,
        }
    }

    /// Start the head's time when a head begins; stop it when none is being read.
    fn time_head(&mut self) {
        let started = self.tracker.as_ref().and_then(Tracker::head_started);
        match (started, &self.deadline) {
            (None, _) => self.deadline = None,
            (Some(head), Some((timed, _))) if head == *timed => {}
            (Some(head), _) => {
                self.deadline = Some((head, Box::pin(tokio::time::sleep(self.header_timeout))));
            }
        }
    }

    /// The head's time ran out (the stand-in is ready for hyper).
    fn timed_out(&mut self, cx: &mut Context<'_>) -> bool {
        let Some((_, deadline)) = self.deadline.as_mut() else {
            return false;
        };
        if deadline.as_mut().poll(cx).is_pending() {
            return false;
        }
        self.deadline = None;
        if let Some(t) = self.tracker.as_mut() {
            t.time_out(self.header_timeout.as_secs(), &mut self.ready);
        }
        true
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.tracker.is_none() {
            return Pin::new(&mut this.inner).poll_read(cx, buf);
        }
        loop {
            if !this.ready.is_empty() {
                let n = this.ready.len().min(buf.remaining());
                buf.put_slice(&this.ready[..n]);
                this.ready.drain(..n);
                return Poll::Ready(Ok(()));
            }
            if let Some(t) = this.tracker.as_mut()
                && t.awaiting_upgrade(&mut this.ready)
            {
                // Woken with hyper's task when the proxy's answer is in.
                return Poll::Pending;
            }
            if !this.ready.is_empty() {
                continue;
            }
            let before = buf.filled().len();
            // A body's bytes that pass as they come are read straight into hyper's buffer.
            let passing = this.tracker.as_ref().and_then(Tracker::passing);
            if let Some(left) = passing
                && left >= buf.remaining() as u64
            {
                let r = Pin::new(&mut this.inner).poll_read(cx, buf);
                let n = buf.filled().len() - before;
                if let (Poll::Ready(Ok(())), Some(t)) = (&r, this.tracker.as_mut()) {
                    t.passed(n as u64);
                }
                return r;
            }
            match Pin::new(&mut this.inner).poll_read(cx, buf) {
                Poll::Ready(Ok(())) => {}
                Poll::Pending if this.timed_out(cx) => continue,
                other => return other,
            }
            if buf.filled().len() == before {
                return Poll::Ready(Ok(()));
            }
            let data = buf.filled()[before..].to_vec();
            buf.set_filled(before);
            if let Some(t) = this.tracker.as_mut() {
                t.feed(&data, &mut this.ready);
            }
            this.time_head();
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, data)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

//! Whether the agent has read what this host sent: a request no agent knows, answered at once.
//!
//! The agent reads its frames in order and answers a request it cannot parse at once, with an
//! `Error` on that request's own stream and nothing else done (`svc_guest::agent`). So the
//! answer to such a request, sent after an `Open`, says the agent has read that `Open`: the
//! command is started (or refused on its own stream). An agent that is stopped (a guest that
//! sends its init's server `SIGSTOP`) or otherwise stuck never answers, and the caller's wait
//! for it is bounded instead of its command's.

use std::{sync::Arc, time::Duration};

use svc_guest::proto::{Frame, Kind};
use tokio::sync::{Semaphore, mpsc};

use super::{
    Channel,
    streams::{Event, StreamOut, lock},
};

/// How long a guest's agent (or a container's init) has to take a command, that is to read its
/// request (the command then runs as long as it runs): long enough that a loaded host is not
/// taken for a stopped or stuck guest.
pub const START: Duration = Duration::from_secs(10);

/// The request: an operation no agent has, so every agent refuses it at once.
const PROBE: &[u8] = br#"{"op":"ping"}"#;

/// Why the agent did not say it read what was sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoAck {
    /// The channel ended (the reason).
    Ended(String),
    /// No answer within the limit: the agent is stopped or stuck.
    Late,
}

impl Channel {
    /// Wait, at most `limit`, until the agent has read every frame sent before this call.
    pub async fn acked(&self, limit: Duration) -> Result<(), NoAck> {
        let id = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (tx, mut events) = mpsc::unbounded_channel();
        lock(&self.streams).insert(
            id,
            StreamOut {
                events: tx,
                credit: Arc::new(Semaphore::new(0)),
                unread: Arc::default(),
            },
        );
        if self
            .out
            .send(Frame::new(id, Kind::Open, PROBE.to_vec()))
            .is_err()
        {
            lock(&self.streams).remove(&id);
            return Err(NoAck::Ended(self.ended_reason()));
        }
        // The channel may have ended before the stream was there to hear it.
        let mut ended = self.ended.clone();
        let answer = tokio::time::timeout(limit, async {
            loop {
                tokio::select! {
                    biased;
                    event = events.recv() => match event {
                        Some(Event::Exit(_) | Event::Error(_)) => return Ok(()),
                        // Output on it is the agent's to send on no request of ours: ignored
                        // (and bounded by the stream's window, as any stream's).
                        Some(Event::Stdout(_) | Event::Stderr(_)) => {}
                        None => return Err(NoAck::Ended(self.ended_reason())),
                    },
                    _ = ended.wait_for(Option::is_some) => {
                        return Err(NoAck::Ended(self.ended_reason()));
                    }
                }
            }
        })
        .await;
        answer.unwrap_or_else(|_| {
            lock(&self.streams).remove(&id);
            Err(NoAck::Late)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The real agent over a socket pair: it answers the probe, after the frames before it.
    #[tokio::test]
    async fn the_agent_answers_at_once_and_a_silent_one_is_late() {
        let (host, agent) = tokio::net::UnixStream::pair().expect("pair");
        let (ar, aw) = agent.into_split();
        let served = tokio::spawn(svc_guest::agent::serve(
            ar,
            aw,
            Arc::new(NoSystem),
            Arc::default(),
        ));
        let (r, w) = host.into_split();
        let (channel, mut hellos) = Channel::over(r, w);
        channel
            .greet(
                &mut hellos,
                std::time::Instant::now() + Duration::from_secs(5),
            )
            .await
            .expect("greeted");
        assert_eq!(channel.acked(Duration::from_secs(5)).await, Ok(()));
        served.abort();
        let _ = served.await;

        // A peer that reads nothing and says nothing.
        let (host, silent) = tokio::net::UnixStream::pair().expect("pair");
        let (r, w) = host.into_split();
        let (channel, _hellos) = Channel::over(r, w);
        assert_eq!(
            channel.acked(Duration::from_millis(200)).await,
            Err(NoAck::Late)
        );
        drop(silent);
    }

    struct NoSystem;

    impl svc_guest::agent::System for NoSystem {
        fn setup(&self, _: &svc_guest::proto::Setup) -> Result<(), String> {
            Err("no".into())
        }
        fn mount(&self, _: &str, _: &str) -> Result<(), String> {
            Err("no".into())
        }
    }
}

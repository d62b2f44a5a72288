//! A held command's start ([`crate::proto::Exec::held`]): prepared on its `Open`, started only
//! on the host's `Go`; discarded on its `Cancel`, or when the host goes away (its end of the
//! channel closes, or another host says hello) before either. The first word is the one that
//! counts: a `Go` after a `Cancel` starts nothing.

use tokio::sync::oneshot;

use super::streams::error;
use crate::proto::Frame;

/// What became of a held command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verdict {
    /// The host said `Go`: start it.
    Go,
    /// The host said `Cancel`: its caller was told it did not run.
    Cancelled,
    /// The host went away before saying either.
    HostGone,
}

/// The host's side of a held command, kept with its stream: where its `Go` or `Cancel` goes.
pub(super) struct Gate(Option<oneshot::Sender<Verdict>>);

/// The command's side: waits for the verdict.
pub(super) struct Held(oneshot::Receiver<Verdict>);

/// A gate and the command held behind it.
pub(super) fn held() -> (Gate, Held) {
    let (tx, rx) = oneshot::channel();
    (Gate(Some(tx)), Held(rx))
}

impl Gate {
    /// Say `verdict`, unless one was said already.
    pub(super) fn say(&mut self, verdict: Verdict) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(verdict);
        }
    }
}

impl Held {
    /// The verdict; [`Verdict::HostGone`] once the gate is dropped unsaid (the host's streams
    /// were ended).
    pub(super) async fn verdict(self) -> Verdict {
        self.0.await.unwrap_or(Verdict::HostGone)
    }
}

impl Verdict {
    /// The answer on stream `id` for a command not started, or `None` for `Go`.
    pub(super) fn refusal(self, id: u32) -> Option<Frame> {
        let why = match self {
            Self::Go => return None,
            Self::Cancelled => "the host cancelled this command before it started (its caller \
                                was told it did not run): discarded, never started",
            Self::HostGone => "the host went away before it said to start this command: \
                               discarded, never started",
        };
        Some(error(id, why.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict(h: Held) -> Verdict {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime")
            .block_on(h.verdict())
    }

    #[test]
    fn the_first_word_counts_and_silence_is_the_host_gone() {
        struct Case {
            name: &'static str,
            said: &'static [Verdict],
            want: Verdict,
        }
        for c in [
            Case {
                name: "go",
                said: &[Verdict::Go],
                want: Verdict::Go,
            },
            Case {
                name: "cancel",
                said: &[Verdict::Cancelled],
                want: Verdict::Cancelled,
            },
            Case {
                name: "a go after a cancel starts nothing",
                said: &[Verdict::Cancelled, Verdict::Go],
                want: Verdict::Cancelled,
            },
            Case {
                name: "a cancel after a go stops nothing",
                said: &[Verdict::Go, Verdict::Cancelled],
                want: Verdict::Go,
            },
            Case {
                name: "the gate dropped unsaid",
                said: &[],
                want: Verdict::HostGone,
            },
        ] {
            let (mut gate, held) = held();
            for v in c.said {
                gate.say(*v);
            }
            drop(gate);
            assert_eq!(verdict(held), c.want, "{}", c.name);
        }
    }

    #[test]
    fn only_go_starts_and_the_others_say_why_not() {
        assert_eq!(Verdict::Go.refusal(3), None);
        for (v, want) in [
            (Verdict::Cancelled, "cancelled"),
            (Verdict::HostGone, "went away"),
        ] {
            let f = v.refusal(3).expect("a refusal");
            assert_eq!((f.stream, f.kind), (3, crate::proto::Kind::Error));
            let said = String::from_utf8_lossy(&f.payload);
            assert!(said.contains(want) && said.contains("never started"), "{said}");
        }
    }
}

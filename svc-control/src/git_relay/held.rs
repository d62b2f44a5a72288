//! A push's command list, held in svcd until it is whole: when it is read again.
//!
//! The reader (`policy::receive_pack`) reads the held bytes from the start each time, so reading
//! them on every `Data` frame would let a guest that sends its command list a byte a frame make
//! svcd scan the same megabytes millions of times. The list (and its push options) can only be
//! whole once a pkt-line that ends it (`0000`, `0001`, `0002`) has arrived, so [`Schedule`]
//! follows the pkt-line framing as bytes arrive — each byte looked at once — and the held bytes
//! are read again only when such a pkt-line is complete, when the framing is not git's (the
//! reader then says why), or when they pass the reader's limit (it refuses them).

use crate::policy::receive_pack::MAX_COMMANDS;

/// git's `LARGE_PACKET_MAX` (the reader refuses a longer pkt-line).
const LARGE_PACKET_MAX: usize = 65520;

/// Where the next pkt-line of the held bytes starts.
#[derive(Debug, Default)]
pub(super) struct Schedule {
    next: usize,
}

impl Schedule {
    /// Whether the held bytes should be read again now that more arrived.
    pub(super) fn due(&mut self, held: &[u8]) -> bool {
        if held.len() > MAX_COMMANDS + LARGE_PACKET_MAX {
            return true;
        }
        loop {
            let Some(head) = held.get(self.next..self.next + 4) else {
                return false;
            };
            let mut len = 0usize;
            for b in head {
                let Some(d) = char::from(*b).to_digit(16) else {
                    return true;
                };
                len = len * 16 + d as usize;
            }
            match len {
                0..=2 => {
                    self.next += 4;
                    return true;
                }
                3 => return true,
                n if n - 4 >= LARGE_PACKET_MAX => return true,
                n if held.len() < self.next + n => return false,
                n => self.next += n,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feed `stream` in frames of `size` bytes: how many reads were due, and whether the last
    /// frame's was.
    fn reads(stream: &[u8], size: usize) -> (usize, bool) {
        let mut s = Schedule::default();
        let mut held = Vec::new();
        let (mut n, mut last) = (0, false);
        for chunk in stream.chunks(size) {
            held.extend_from_slice(chunk);
            last = s.due(&held);
            n += usize::from(last);
        }
        (n, last)
    }

    fn pkt(payload: &str) -> String {
        format!("{:04x}{payload}", payload.len() + 4)
    }

    #[test]
    fn a_command_list_is_read_when_its_flush_arrives_however_it_is_cut() {
        let zero = "0".repeat(40);
        let list = format!(
            "{}{}0000",
            pkt(&format!(
                "{zero} {} refs/heads/svc/x\0report-status\n",
                "1".repeat(40)
            )),
            pkt(&format!("{zero} {} refs/heads/svc/y\n", "2".repeat(40))),
        );
        for size in [1, 2, 3, 5, 7, 64, list.len()] {
            assert_eq!(
                reads(list.as_bytes(), size),
                (1, true),
                "frames of {size}: only the frame that completes the flush prompts a read \
                 (zero ids inside payloads do not)"
            );
        }
    }

    #[test]
    fn push_options_after_the_list_prompt_a_second_read() {
        let stream = format!(
            "{}0000{}0000",
            pkt("push-cert\0push-options\n"),
            pkt("ci.skip\n")
        );
        assert_eq!(reads(stream.as_bytes(), 3), (2, true));
    }

    #[test]
    fn a_list_sent_a_byte_a_frame_is_never_read_before_it_ends() {
        let one = pkt(&format!("shallow {}\n", "a".repeat(40)));
        let stream = one.repeat(20_000);
        assert_eq!(reads(stream.as_bytes(), 1), (0, false));
    }

    #[test]
    fn framing_that_is_not_gits_or_past_the_limit_is_read_at_once() {
        for (name, bad) in [
            ("non_hex", "00x5abc"),
            ("length_three", "0003"),
            ("too_long", "fff5"),
        ] {
            assert!(reads(bad.as_bytes(), bad.len()).1, "{name}");
        }
        let mut s = Schedule::default();
        let huge = pkt(&"a".repeat(60_000)).repeat(MAX_COMMANDS / 60_000 + 2);
        assert!(s.due(huge.as_bytes()), "past the reader's limit");
    }
}

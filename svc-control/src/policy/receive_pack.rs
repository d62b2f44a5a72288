//! A push's command list, read the way git's `receive-pack` reads it (`read_head_info`,
//! `queue_commands_from_cert`, `parse_signed_buffer` in git's `builtin/receive-pack.c` and
//! `gpg-interface.c`), so the refs svc checks are the refs the server acts on.
//!
//! git's rules, followed byte for byte:
//! - pkt-lines have a four-hex-digit length (either case, nothing else); `0000`, `0001` and
//!   `0002` end the command list, `0003` and lengths over 65523 are errors; one trailing `\n` of a
//!   payload is dropped, and a line ends at its first NUL (the capabilities follow that NUL, on
//!   any line, each line's adding to the last's).
//! - `shallow <id>` lines (longer than eight bytes) are skipped; an empty pkt-line is a command
//!   (and not one git can read).
//! - A `push-cert` line opens a certificate: its pkt-lines, newlines kept and each cut at its
//!   first NUL, are joined into one buffer until `push-cert-end\n`, and a flush inside it ends
//!   the whole command list. After the list, the buffer's commands are the lines from its first
//!   blank line up to the last line that starts with a signature marker (the whole rest when
//!   none does), whatever pkt-lines they came in. Commands outside a certificate count too.
//!
//! On top, svc refuses what no git client sends and what two versions of git could read
//! differently, naming why: a certificate with commands outside it or a second certificate, one
//! not closed by `push-cert-end`, one whose pkt-lines are not one line each, one without the
//! `certificate version 0.1` header or a signature, a signature marker in its header or a second
//! one after its commands. Its commands are then read a second way, a pkt-line at a time, and
//! the push is refused unless both readings give the same commands, one for one.

/// One ref a push updates (a creation has an all-zero old id, a deletion an all-zero new id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefUpdate {
    pub old: String,
    pub new: String,
    pub name: String,
}

/// A push's command list, read before anything of it is forwarded.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PushCommands {
    /// Every update git queues, in its order (a signed push's are those of its certificate).
    pub updates: Vec<RefUpdate>,
    /// The client's capabilities (after the NUL of any command or of `push-cert`).
    pub capabilities: Vec<String>,
    pub push_options: Vec<String>,
    /// Whether the commands came in a push certificate.
    pub signed: bool,
    /// Bytes of the stream the command list (and push options) took; the pack follows.
    pub consumed: usize,
}

/// What is wrong with a push's command list (the line git's stderr gets, after `svc: refused: `).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PushError {
    #[error("bad pkt-line length {0:?}")]
    Length(String),
    #[error("bad command line {0:?}")]
    Command(String),
    #[error("bad shallow line {0:?}")]
    Shallow(String),
    #[error("a push certificate {0}")]
    Certificate(&'static str),
    #[error(
        "the push certificate's commands read as git joins its pkt-lines ({git}) differ from \
         its lines one by one ({lines})"
    )]
    CertificateCommands { git: String, lines: String },
    #[error("the command list is over {0} bytes")]
    TooLong(usize),
}

/// Longest command list (with push options) read before the push is decided.
pub const MAX_COMMANDS: usize = 4 << 20;

/// git's `LARGE_PACKET_MAX`: the largest payload its pkt-line reader takes is one byte less.
const LARGE_PACKET_MAX: usize = 65520;

/// The lines git's `parse_signed_buffer` takes as the start of a signature (OpenPGP, X.509,
/// SSH; `gpg-interface.c`).
const SIGNATURE_MARKERS: [&[u8]; 4] = [
    b"-----BEGIN PGP SIGNATURE-----",
    b"-----BEGIN PGP MESSAGE-----",
    b"-----BEGIN SIGNED MESSAGE-----",
    b"-----BEGIN SSH SIGNATURE-----",
];

/// The first line of every push certificate git writes.
const CERT_HEADER: &[u8] = b"certificate version 0.1\n";

/// One pkt-line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pkt<'a> {
    Data(&'a [u8]),
    /// `0000`, `0001` or `0002`: git's reader returns something other than a line.
    End,
}

/// Read a push's command list from the start of the client's stream (after the server's ref
/// advertisement): `Ok(None)` until it is all there (and its push options, if the client asked
/// for them), then the commands and how many bytes they took.
pub fn parse_push(buf: &[u8]) -> Result<Option<PushCommands>, PushError> {
    let mut reader = Reader { buf, at: 0 };
    let Some(head) = read_head_info(&mut reader, Names::Checked)? else {
        return Ok(None);
    };
    let mut out = PushCommands {
        updates: head.unsigned.clone(),
        signed: head.certificates > 0,
        ..PushCommands::default()
    };
    for caps in &head.capabilities {
        for c in caps.split(|b| is_git_space(*b)).filter(|c| !c.is_empty()) {
            out.capabilities
                .push(String::from_utf8_lossy(c).into_owned());
        }
    }
    if out.signed {
        check_framing(&head)?;
        let by_line = commands_by_line(&head.cert_lines)?;
        let certified = certificate_commands(&head.cert, Names::Checked)?;
        compare(&certified, &by_line)?;
        out.updates = certified;
    }
    if out
        .capabilities
        .iter()
        .any(|c| c == "push-options" || c.starts_with("push-options="))
    {
        loop {
            let Some(pkt) = reader.next()? else {
                return Ok(None);
            };
            match pkt {
                Pkt::End => break,
                Pkt::Data(p) => out
                    .push_options
                    .push(String::from_utf8_lossy(chomp(p)).into_owned()),
            }
        }
    }
    out.consumed = reader.at;
    Ok(Some(out))
}

/// The updates git itself would queue from `buf` and whether it holds a certificate, as far as
/// git's own reading goes (without svc's refusals): what the audit names when svc refuses a
/// stream. Empty when even git's reading fails or the list has not ended.
pub fn git_reading(buf: &[u8]) -> (Vec<RefUpdate>, bool) {
    let mut reader = Reader { buf, at: 0 };
    let Ok(Some(head)) = read_head_info(&mut reader, Names::AsGit) else {
        return (Vec::new(), false);
    };
    let mut updates = head.unsigned;
    if !head.cert.is_empty() {
        updates.extend(certificate_commands(&head.cert, Names::AsGit).unwrap_or_default());
    }
    (updates, head.certificates > 0)
}

struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    /// The next pkt-line, `None` if more bytes are needed.
    fn next(&mut self) -> Result<Option<Pkt<'a>>, PushError> {
        if self.at > MAX_COMMANDS {
            return Err(PushError::TooLong(MAX_COMMANDS));
        }
        let rest = &self.buf[self.at..];
        let Some(head) = rest.get(..4) else {
            return Ok(None);
        };
        let bad = || PushError::Length(String::from_utf8_lossy(head).into_owned());
        let mut len = 0usize;
        for b in head {
            // git's `hexval`: 0-9, a-f, A-F and nothing else (no sign, no space).
            let d = char::from(*b).to_digit(16).ok_or_else(bad)?;
            len = len * 16 + d as usize;
        }
        let pkt = match len {
            0..=2 => {
                self.at += 4;
                return Ok(Some(Pkt::End));
            }
            3 => return Err(bad()),
            n if n - 4 >= LARGE_PACKET_MAX => return Err(bad()),
            n => match rest.get(4..n) {
                None => return Ok(None),
                Some(p) => Pkt::Data(p),
            },
        };
        self.at += len;
        Ok(Some(pkt))
    }
}

/// What git's `read_head_info` collected.
#[derive(Debug, Default)]
struct HeadInfo {
    unsigned: Vec<RefUpdate>,
    /// Every certificate's pkt-lines joined, each cut at its first NUL, as git's `push_cert`.
    cert: Vec<u8>,
    /// The certificates' pkt-lines as they came.
    cert_lines: Vec<Vec<u8>>,
    certificates: usize,
    /// A certificate ended by a flush instead of `push-cert-end`.
    unclosed: bool,
    /// Each line's bytes after its first NUL.
    capabilities: Vec<Vec<u8>>,
}

/// git's `read_head_info`: `Ok(None)` until the list has ended.
fn read_head_info(reader: &mut Reader<'_>, names: Names) -> Result<Option<HeadInfo>, PushError> {
    let mut head = HeadInfo::default();
    loop {
        let Some(pkt) = reader.next()? else {
            return Ok(None);
        };
        let Pkt::Data(payload) = pkt else { break };
        let line = chomp(payload);
        if line.len() > 8 && line.starts_with(b"shallow ") {
            let oid = &line[8..];
            if !is_oid(oid) {
                return Err(PushError::Shallow(shown(line)));
            }
            continue;
        }
        let (text, caps) = split_nul(line);
        if let Some(caps) = caps {
            head.capabilities.push(split_nul(caps).0.to_vec());
        }
        if text == b"push-cert" {
            head.certificates += 1;
            loop {
                let Some(pkt) = reader.next()? else {
                    return Ok(None);
                };
                let Pkt::Data(raw) = pkt else {
                    // git: a flush ends the certificate and the command list; a delimiter
                    // dies. Both are refused below or here.
                    head.unclosed = true;
                    break;
                };
                let cut = split_nul(raw).0;
                if cut == b"push-cert-end\n" {
                    break;
                }
                head.cert.extend_from_slice(cut);
                head.cert_lines.push(raw.to_vec());
            }
            if head.unclosed {
                break;
            }
            continue;
        }
        head.unsigned.push(parse_command(text, names)?);
    }
    Ok(Some(head))
}

/// git's `queue_commands_from_cert`: the lines from the first blank line to the start of the
/// last signature (or the end).
fn certificate_commands(cert: &[u8], names: Names) -> Result<Vec<RefUpdate>, PushError> {
    if cert.is_empty() {
        return Err(PushError::Certificate("is empty"));
    }
    let Some(blank) = find(cert, b"\n\n") else {
        return Err(PushError::Certificate("has no blank line after its header"));
    };
    let begin = blank + 2;
    let end = signature_start(cert);
    let mut updates = Vec::new();
    let mut at = begin;
    while at < end {
        let line_end = cert[at..end]
            .iter()
            .position(|b| *b == b'\n')
            .map_or(end, |i| at + i);
        updates.push(parse_command(&cert[at..line_end], names)?);
        at = if line_end < end { line_end + 1 } else { end };
    }
    Ok(updates)
}

/// git's `parse_signed_buffer`: where the last line starting with a signature marker starts,
/// or the buffer's length.
fn signature_start(buf: &[u8]) -> usize {
    let mut at = 0;
    let mut found = buf.len();
    while at < buf.len() {
        if is_marker(&buf[at..]) {
            found = at;
        }
        at = buf[at..]
            .iter()
            .position(|b| *b == b'\n')
            .map_or(buf.len(), |i| at + i + 1);
    }
    found
}

fn is_marker(line: &[u8]) -> bool {
    SIGNATURE_MARKERS.iter().any(|m| line.starts_with(m))
}

/// svc's rules for how a certificate comes: alone, once, closed.
fn check_framing(head: &HeadInfo) -> Result<(), PushError> {
    let refuse = |why| Err(PushError::Certificate(why));
    if head.certificates > 1 {
        return refuse("comes twice");
    }
    if !head.unsigned.is_empty() {
        return refuse("comes with commands outside it");
    }
    if head.unclosed {
        return refuse("is not closed by push-cert-end");
    }
    if head.cert_lines.is_empty() {
        return refuse("is empty");
    }
    Ok(())
}

/// svc's rules for a certificate's lines, then its commands read a pkt-line at a time: the
/// lines after its blank line up to its signature.
fn commands_by_line(lines: &[Vec<u8>]) -> Result<Vec<RefUpdate>, PushError> {
    let refuse = |why| Err(PushError::Certificate(why));
    let one_line = |l: &Vec<u8>| {
        l.last() == Some(&b'\n') && !l[..l.len() - 1].contains(&b'\n') && !l.contains(&0)
    };
    if !lines.iter().all(one_line) {
        return refuse(
            "has a pkt-line that is not exactly one line (empty, split, joined or with a NUL)",
        );
    }
    if lines.first().map(Vec::as_slice) != Some(CERT_HEADER) {
        return refuse("does not start with \"certificate version 0.1\"");
    }
    let Some(blank) = lines.iter().position(|l| l.as_slice() == b"\n") else {
        return refuse("has no blank line after its header");
    };
    if lines[..blank].iter().any(|l| l.starts_with(b"-----")) {
        return refuse("has a signature marker in its header");
    }
    let Some(signature) = lines[blank..].iter().position(|l| l.starts_with(b"-----")) else {
        return refuse("has no signature");
    };
    let signature = blank + signature;
    if !is_marker(&lines[signature]) {
        return refuse("has a signature of a kind git does not know");
    }
    if lines[signature + 1..].iter().any(|l| is_marker(l)) {
        return refuse("has a second signature marker");
    }
    lines[blank + 1..signature]
        .iter()
        .map(|l| parse_command(chomp(l), Names::Checked))
        .collect()
}

/// The push goes on only if git's reading of the certificate and svc's line-by-line one agree,
/// command for command.
fn compare(certified: &[RefUpdate], by_line: &[RefUpdate]) -> Result<(), PushError> {
    if by_line == certified {
        return Ok(());
    }
    let names = |u: &[RefUpdate]| {
        let v: Vec<&str> = u.iter().map(|u| u.name.as_str()).collect();
        shown(v.join(" ").as_bytes())
    };
    Err(PushError::CertificateCommands {
        git: names(certified),
        lines: names(by_line),
    })
}

/// How a command's ref name is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Names {
    /// svc's rule: refused when empty, not UTF-8, or holding a space or a control character.
    Checked,
    /// git's: the rest of the line, whatever it holds (for [`git_reading`]).
    AsGit,
}

/// git's `queue_command`: `<old> <new> <ref>`, both ids of one hash's length, the name the
/// rest of the line. With [`Names::Checked`] svc refuses a name git would take as given but
/// that is empty, not UTF-8, or holds a space or a control character.
fn parse_command(line: &[u8], names: Names) -> Result<RefUpdate, PushError> {
    let bad = || PushError::Command(shown(line));
    let hexsz = match (line.get(40), line.get(64)) {
        (Some(b' '), _) => 40,
        (_, Some(b' ')) => 64,
        _ => return Err(bad()),
    };
    let old = &line[..hexsz];
    let rest = &line[hexsz + 1..];
    let (Some(new), Some(b' ')) = (rest.get(..hexsz), rest.get(hexsz)) else {
        return Err(bad());
    };
    if !is_oid(old) || !is_oid(new) {
        return Err(bad());
    }
    let raw = &rest[hexsz + 1..];
    let name = match names {
        Names::AsGit => String::from_utf8_lossy(raw).into_owned(),
        Names::Checked => {
            let name = std::str::from_utf8(raw).map_err(|_| bad())?;
            if name.is_empty() || name.chars().any(|c| c == ' ' || c.is_control()) {
                return Err(bad());
            }
            name.to_owned()
        }
    };
    Ok(RefUpdate {
        old: String::from_utf8_lossy(old).to_ascii_lowercase(),
        new: String::from_utf8_lossy(new).to_ascii_lowercase(),
        name,
    })
}

fn is_oid(s: &[u8]) -> bool {
    (s.len() == 40 || s.len() == 64) && s.iter().all(u8::is_ascii_hexdigit)
}

/// git's `PACKET_READ_CHOMP_NEWLINE`: one trailing `\n` goes.
fn chomp(p: &[u8]) -> &[u8] {
    p.strip_suffix(b"\n").unwrap_or(p)
}

/// A C string's view of `line`: up to its first NUL, and what follows that NUL.
fn split_nul(line: &[u8]) -> (&[u8], Option<&[u8]>) {
    match line.iter().position(|b| *b == 0) {
        Some(i) => (&line[..i], Some(&line[i + 1..])),
        None => (line, None),
    }
}

/// git's `isspace`: space, tab, line feed, carriage return.
fn is_git_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// What the guest sent, shortened and escaped, before it goes into a message.
fn shown(s: &[u8]) -> String {
    let text = String::from_utf8_lossy(s);
    let mut out: String = text.chars().take(80).collect();
    if text.chars().count() > 80 {
        out.push('…');
    }
    out
}

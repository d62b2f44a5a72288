//! The host↔guest channel's protocol: length-prefixed frames, multiplexed by stream.
//!
//! One channel (a virtio-serial port on QEMU) carries many streams: each `exec`, each file the
//! host writes, the guest's setup. A frame is
//!
//! ```text
//! stream: u32 (big endian) | kind: u8 | length: u32 (big endian) | payload (length bytes)
//! ```
//!
//! Stream 0 is the channel's own: the host opens with [`Kind::Hello`] carrying a nonce and the
//! agent answers [`Kind::Hello`] with [`crate::READY`] and the same nonce, so a host that
//! (re)connects knows which answer is to it. A stream starts with [`Kind::Open`] (a JSON
//! [`Request`]) from the host and ends with [`Kind::Exit`] or [`Kind::Error`] from the agent.
//!
//! Streams whose id has [`GUEST_STREAM`] set are opened by the guest instead: a connection
//! to one of the host's services for the sandbox (the git SSH relay). On those the directions
//! turn: the guest sends `Open`, `Data`, `Eof`; the host answers `Stdout`, `Stderr`, `Exit`
//! or `Error` (and an `Error` from the guest says its end went away).
//!
//! A command the host's caller waits for starts in two phases, so that one the host gave up on
//! never runs later: the host's `Open` asks it [`Exec::held`]; the agent prepares it and starts
//! it only on the host's [`Kind::Go`] on its stream. The host sends, right after the `Open`, a
//! probe (a request no agent knows, answered at once with an `Error`: `channel/ack.rs` in
//! svc-control) and sends `Go` only if the probe's answer came within its limit. The argument
//! is the channel's order alone: the agent reads its frames in the order sent and handles each
//! before the next, so the probe's answer says the `Open` was read; the host decides once, on
//! its own clock, whether the answer was in time, and sends `Go` only then. A host that
//! decided "late" sends [`Kind::Cancel`] instead and never a `Go` on that stream, then gives
//! the channel up; an agent that reads the queue later (its process continued, its VM resumed)
//! finds the `Open`, the probe, the `Cancel` (or the end of the channel, or a new host's hello,
//! should the cancel not have been written) and discards the command, answering `Error`. So a
//! held command runs only if the host told its caller it started.
//!
//! Which agents hold: one that does says so in its answer to hello, a [`Kind::Hello`] of
//! [`FEATURES`], the nonce and [`HELD_EXEC`] sent just before its `READY` (the host has it by
//! the time it reads `READY`; a host from before ignores it, as it ignores every hello that is
//! not its `READY`). A host never asks an agent that did not say so to hold (an older agent
//! refuses an unknown field): it gets the one-phase start, where the `Open` starts the command.
//!
//! Flow control is by credit, per stream and direction: a sender may have at most [`WINDOW`]
//! bytes of `Data`/`Stdout`/`Stderr` payload unacknowledged; the receiver returns
//! [`Kind::Credit`] as it hands the bytes on. So a reader that stops reading stalls its own
//! stream and nothing else, and neither side buffers more than a window per stream.

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt as _};

/// Largest payload of one frame.
pub const MAX_PAYLOAD: usize = 64 * 1024;

/// Bytes a sender may have in flight per stream before it waits for credit.
pub const WINDOW: u32 = 256 * 1024;

/// The bit of a stream id that says the guest opened the stream (host-opened ids never have it).
pub const GUEST_STREAM: u32 = 1 << 31;

/// Bytes of a frame's header.
pub const HEADER: usize = 9;

/// What a frame says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// Stream 0: host → agent with a nonce; agent → host with `READY nonce`.
    Hello = 1,
    /// Host → agent: start a stream; payload is a JSON [`Request`].
    Open = 2,
    /// Host → agent: the command's standard input (or a file's content).
    Data = 3,
    /// Host → agent: end of standard input.
    Eof = 4,
    /// Agent → host: the command's standard output (everything, on a terminal).
    Stdout = 5,
    /// Agent → host: the command's standard error.
    Stderr = 6,
    /// Agent → host: the stream is done; payload is the exit code (i32, big endian).
    Exit = 7,
    /// Host → agent: the terminal's new size (rows u16, columns u16, big endian).
    Resize = 8,
    /// Host → agent: send a signal (i32 signal number, big endian) to the command.
    Signal = 9,
    /// Agent → host: the request failed before it ran; payload is the reason (UTF-8).
    Error = 10,
    /// Either way: the receiver handed on this many more bytes (u32, big endian).
    Credit = 11,
    /// Host → agent: start the stream's held command ([`Exec::held`]). Empty payload.
    Go = 12,
    /// Host → agent: discard the stream's held command, unstarted (its caller was told it
    /// failed); the agent answers `Error`. Empty payload.
    Cancel = 13,
}

/// What an agent's first hello answer starts with when it says what it can do: then the
/// host's nonce and the features, separated by spaces.
pub const FEATURES: &str = "svc-agent features";

/// The feature of an agent that holds a command until the host's [`Kind::Go`].
pub const HELD_EXEC: &str = "held-exec";

impl Kind {
    fn from_u8(b: u8) -> Option<Self> {
        Some(match b {
            1 => Self::Hello,
            2 => Self::Open,
            3 => Self::Data,
            4 => Self::Eof,
            5 => Self::Stdout,
            6 => Self::Stderr,
            7 => Self::Exit,
            8 => Self::Resize,
            9 => Self::Signal,
            10 => Self::Error,
            11 => Self::Credit,
            12 => Self::Go,
            13 => Self::Cancel,
            _ => return None,
        })
    }
}

/// One frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub stream: u32,
    pub kind: Kind,
    pub payload: Vec<u8>,
}

impl Frame {
    pub fn new(stream: u32, kind: Kind, payload: impl Into<Vec<u8>>) -> Self {
        Self {
            stream,
            kind,
            payload: payload.into(),
        }
    }

    /// A frame whose payload is one big-endian u32.
    pub fn u32(stream: u32, kind: Kind, value: u32) -> Self {
        Self::new(stream, kind, value.to_be_bytes())
    }

    /// A frame whose payload is one big-endian i32.
    pub fn i32(stream: u32, kind: Kind, value: i32) -> Self {
        Self::new(stream, kind, value.to_be_bytes())
    }

    /// The frame on the wire. Payloads over [`MAX_PAYLOAD`] are the caller's bug: senders
    /// split data with [`chunks`].
    pub fn encode(&self) -> Vec<u8> {
        let len = u32::try_from(self.payload.len()).unwrap_or(u32::MAX);
        let mut out = Vec::with_capacity(HEADER + self.payload.len());
        out.extend_from_slice(&self.stream.to_be_bytes());
        out.push(self.kind as u8);
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(&self.payload);
        out
    }

    /// The payload as a big-endian u32, if it is exactly four bytes.
    pub fn as_u32(&self) -> Option<u32> {
        Some(u32::from_be_bytes(self.payload.as_slice().try_into().ok()?))
    }

    /// The payload as a big-endian i32, if it is exactly four bytes.
    pub fn as_i32(&self) -> Option<i32> {
        Some(i32::from_be_bytes(self.payload.as_slice().try_into().ok()?))
    }
}

/// Split `data` into payloads a frame may carry.
pub fn chunks(data: &[u8]) -> impl Iterator<Item = &[u8]> {
    data.chunks(MAX_PAYLOAD)
}

/// What is wrong with the bytes on the channel.
#[derive(Debug, thiserror::Error)]
pub enum ProtoError {
    #[error("reading the channel: {0}")]
    Io(#[from] std::io::Error),
    #[error("the channel ended in the middle of a frame")]
    Truncated,
    #[error("frame of unknown kind {0}")]
    UnknownKind(u8),
    #[error("frame payload of {0} bytes is over the limit of {MAX_PAYLOAD}")]
    TooLarge(u32),
}

/// Read one frame; `None` at a clean end of the channel (between frames).
pub async fn read_frame<R: AsyncRead + Unpin>(r: &mut R) -> Result<Option<Frame>, ProtoError> {
    let mut header = [0u8; HEADER];
    let mut got = 0;
    while got < HEADER {
        let n = r.read(&mut header[got..]).await?;
        if n == 0 {
            return if got == 0 {
                Ok(None)
            } else {
                Err(ProtoError::Truncated)
            };
        }
        got += n;
    }
    let stream = u32::from_be_bytes([header[0], header[1], header[2], header[3]]);
    let kind = Kind::from_u8(header[4]).ok_or(ProtoError::UnknownKind(header[4]))?;
    let len = u32::from_be_bytes([header[5], header[6], header[7], header[8]]);
    if len as usize > MAX_PAYLOAD {
        return Err(ProtoError::TooLarge(len));
    }
    let mut payload = vec![0u8; len as usize];
    r.read_exact(&mut payload).await.map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            ProtoError::Truncated
        } else {
            ProtoError::Io(e)
        }
    })?;
    Ok(Some(Frame {
        stream,
        kind,
        payload,
    }))
}

/// What a stream asks of the agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Request {
    /// Run a command.
    Exec(Exec),
    /// Write the stream's `Data` to `path` (replaced whole once `Eof` arrives, never partly).
    WriteFile { path: String, mode: u32 },
    /// Configure the guest for its sandbox: at boot and again in each clone after a fork.
    Setup(Setup),
    /// Mount the virtio-fs file system `tag` at `path` (made if missing).
    Mount { tag: String, path: String },
    /// Bind the tree the host put at `tree` in the trees share ([`TREES_DIR`]`/tree`, one
    /// path component) at `path` (made if missing; no symbolic link on the way is followed),
    /// then the guest's own `binds` inside it (a pod container's root file system). The
    /// places of `binds` skipped (a link in the tree where one goes, …) come back on the
    /// stream's standard error, one line each with why, before its exit 0.
    BindTree {
        tree: String,
        path: String,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        binds: Vec<GuestBind>,
    },
    /// Undo [`Request::BindTree`]: unmount what is mounted at `path` (no link followed), and
    /// the guest's own mount of `tree` in the share, if its kernel made one.
    UnbindTree { tree: String, path: String },
    /// The git SSH shim (guest → host): run git's SSH request through the host's relay. The
    /// stream then carries git's input and the server's output like an exec.
    GitSsh {
        /// What git passed to `ssh` (after the program name).
        args: Vec<String>,
        /// git's `GIT_PROTOCOL` (e.g. `version=2`), sent on to the server.
        git_protocol: Option<String>,
    },
}

/// A place of the guest bound over the same place inside a tree ([`Request::BindTree`]):
/// the guest's `/proc`, `/dev`, its resolver's files, as a pod container sees them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GuestBind {
    /// Relative to both roots (`proc`, `etc/hosts`): no `..`, no leading `/`.
    pub path: String,
    /// A directory (else a regular file).
    pub dir: bool,
}

/// The virtio-fs tag of the trees share: the host directory into which the host mounts the
/// trees it attaches to a running guest ([`Request::BindTree`]).
pub const TREES_TAG: &str = "svctrees";

/// Where the guest mounts the trees share (at boot, before anything else runs).
pub const TREES_DIR: &str = "/run/svc/trees";

/// A command to run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Exec {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    /// Its working directory (inside `root` when that is given); default `/`.
    pub cwd: Option<String>,
    /// The command gets a standard input (else end of file at once).
    pub stdin: bool,
    /// Run on a terminal of (rows, columns).
    pub tty: Option<(u16, u16)>,
    /// Run as this user (the host checked the ids); none: the guest's root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<User>,
    /// Run chrooted into this directory (absolute, no `..`): a pod container's own tree,
    /// bound with [`Request::BindTree`]. Its `PATH` lookup and `cwd` are inside it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root: Option<String>,
    /// Keep only these capability sets (the host checked them); none: the agent's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caps: Option<crate::caps::Caps>,
    /// Set `no_new_privs` before the command runs.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub no_new_privs: bool,
    /// Prepare the command but start it only on the host's [`Kind::Go`] (discard it on
    /// [`Kind::Cancel`] or when the host goes away first). Asked only of an agent that said
    /// [`HELD_EXEC`].
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub held: bool,
}

/// The user a command runs as: its ids and supplementary groups (none but these: the
/// agent's own are dropped).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct User {
    pub uid: u32,
    pub gid: u32,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<u32>,
}

/// The guest's identity and network: fresh in every clone of a fork.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Setup {
    pub hostname: String,
    /// The guest's address with its prefix, e.g. `10.200.0.2/30`.
    pub address: String,
    /// Its gateway (the host end of its link), also its only resolver.
    pub gateway: String,
    /// Random bytes (hex) the agent mixes into the guest's entropy pool, so that clones of
    /// one snapshot do not share their random state.
    pub entropy: String,
    /// The host's clock (milliseconds since the Unix epoch): a clone wakes with its source's
    /// time, behind by as long as the snapshot waited.
    pub clock_ms: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_all(bytes: &[u8]) -> Result<Vec<Frame>, ProtoError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .map_err(ProtoError::Io)?;
        rt.block_on(async {
            let mut r = bytes;
            let mut out = Vec::new();
            while let Some(f) = read_frame(&mut r).await? {
                out.push(f);
            }
            Ok(out)
        })
    }

    #[test]
    fn frames_round_trip() {
        let frames = vec![
            Frame::new(0, Kind::Hello, b"n1".to_vec()),
            Frame::new(7, Kind::Data, vec![0u8; MAX_PAYLOAD]),
            Frame::i32(7, Kind::Exit, -3),
            Frame::u32(u32::MAX, Kind::Credit, 4096),
            Frame::new(2, Kind::Eof, Vec::new()),
            Frame::new(2, Kind::Go, Vec::new()),
            Frame::new(3, Kind::Cancel, Vec::new()),
        ];
        let wire: Vec<u8> = frames.iter().flat_map(Frame::encode).collect();
        let back = read_all(&wire).expect("decodes");
        assert_eq!(back, frames);
        assert_eq!(back[2].as_i32(), Some(-3));
        assert_eq!(back[3].as_u32(), Some(4096));
        assert_eq!(back[0].as_u32(), None, "two bytes are not a u32");
    }

    #[test]
    fn bad_bytes_are_named_errors_not_panics() {
        struct Case {
            name: &'static str,
            bytes: Vec<u8>,
            want: &'static str,
        }
        let mut huge = Frame::new(1, Kind::Data, Vec::new()).encode();
        huge[5..9].copy_from_slice(&(MAX_PAYLOAD as u32 + 1).to_be_bytes());
        let mut unknown = Frame::new(1, Kind::Data, Vec::new()).encode();
        unknown[4] = 0xee;
        let mut short = Frame::new(1, Kind::Data, b"abcdef".to_vec()).encode();
        short.truncate(12);
        for c in [
            Case {
                name: "length over the limit",
                bytes: huge,
                want: "over the limit of 65536",
            },
            Case {
                name: "unknown kind",
                bytes: unknown,
                want: "unknown kind 238",
            },
            Case {
                name: "payload cut short",
                bytes: short,
                want: "in the middle of a frame",
            },
            Case {
                name: "header cut short",
                bytes: vec![0, 0, 0],
                want: "in the middle of a frame",
            },
        ] {
            let err = read_all(&c.bytes).expect_err(c.name).to_string();
            assert!(err.contains(c.want), "{}: {err}", c.name);
        }
        assert!(read_all(&[]).expect("empty").is_empty(), "clean end");
    }

    #[test]
    fn requests_are_strict_json() {
        let exec = Request::Exec(Exec {
            argv: vec!["true".into()],
            tty: Some((24, 80)),
            ..Exec::default()
        });
        let json = serde_json::to_string(&exec).expect("json");
        assert!(json.starts_with(r#"{"op":"exec""#), "{json}");
        assert_eq!(serde_json::from_str::<Request>(&json).expect("back"), exec);
        assert!(
            !json.contains("user") && !json.contains("root") && !json.contains("held"),
            "an exec that asks neither says neither (an older agent takes it): {json}"
        );
        let as_user = Request::Exec(Exec {
            argv: vec!["id".into()],
            user: Some(User {
                uid: 1000,
                gid: 1000,
                groups: vec![4],
            }),
            root: Some("/pod/c1".into()),
            held: true,
            ..Exec::default()
        });
        let json = serde_json::to_string(&as_user).expect("json");
        assert_eq!(
            serde_json::from_str::<Request>(&json).expect("back"),
            as_user
        );
        for bad in [
            r#"{"op":"shell","argv":[]}"#,
            r#"{"op":"write-file","path":"/x","mode":420,"owner":"root"}"#,
            r#"{"op":"exec"}"#,
            r#"{"op":"exec","argv":["id"],"env":[],"cwd":null,"stdin":false,"tty":null,"user":{"uid":1,"gid":1,"caps":[]}}"#,
            r#"{"op":"bind-tree","tree":"t1"}"#,
        ] {
            assert!(serde_json::from_str::<Request>(bad).is_err(), "{bad}");
        }
    }
}

//! Differential test of the relay's push reader (`policy::receive_pack`, through `policy::ssh`)
//! against the real receiver: every stream goes to a real `git receive-pack` on a scratch bare
//! repository whose `pre-receive` hook records the ref updates git would apply (and declines
//! them, so the repository never changes), and to svc's reader, fed in random pieces as the
//! relay receives them. The property: every update git's hook saw is one svc read and allowed
//! (AllowedBranches `refs/heads/svc/**`), or svc refused the stream.
//!
//! Streams: the seed corpus in `tests/corpus/receive-pack/` (the push-certificate attack and its
//! variants, each against a SHA-1 and a SHA-256 repository), then generated ones from a seeded
//! generator — certificates with several lines per pkt-line, split lines, blank lines, empty
//! pkt-lines, NULs, flushes and delimiters in odd places, capabilities on later lines, shallow
//! lines, push options, upper-case and SHA-256 ids, packs where git or svc might not expect
//! them. `SVC_DIFF_CASES` (default 1500) sets how many, `SVC_DIFF_SEED` the first seed. Not
//! privileged: it needs only git.
#![expect(clippy::expect_used, reason = "test helpers")]

use std::{
    io::Write as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use svc_control::policy::ssh::{self, RefUpdate};

const BRANCHES: &str = "refs/heads/svc/**";

/// A scratch bare repository of one hash, with two commits and a recording hook.
struct Repo {
    dir: PathBuf,
    c1: String,
    c2: String,
    hexsz: usize,
    empty_pack: Vec<u8>,
}

/// `git ARGS…` in `cwd`, which must succeed; its output, trimmed.
fn git(cwd: &Path, args: &[&str]) -> String {
    svc_tests::world::git(cwd, args).trim().to_owned()
}

impl Repo {
    fn new(root: &Path, format: &str) -> Self {
        let dir = root.join(format!("server-{format}.git"));
        let work = root.join(format!("work-{format}"));
        std::fs::create_dir_all(&work).expect("work");
        let init = ["init", "-q", "-b", "main", "--object-format", format];
        git(
            root,
            &[&init[..], &["--bare", dir.to_str().expect("utf-8")]].concat(),
        );
        git(&work, &init);
        git(&work, &["commit", "-q", "--allow-empty", "-m", "one"]);
        git(&work, &["commit", "-q", "--allow-empty", "-m", "two"]);
        let c1 = git(&work, &["rev-parse", "HEAD~1"]);
        let c2 = git(&work, &["rev-parse", "HEAD"]);
        let to = dir.to_str().expect("utf-8");
        git(
            &work,
            &[
                "push",
                "-q",
                to,
                "HEAD~1:refs/heads/main",
                "HEAD~1:refs/heads/svc/a",
                "HEAD~1:refs/tags/v1",
                "HEAD:refs/heads/other",
            ],
        );
        git(&dir, &["config", "receive.advertisePushOptions", "true"]);
        let hook = dir.join("hooks/pre-receive");
        std::fs::write(&hook, "#!/bin/sh\ncat > \"$SVC_DIFF_OUT\"\nexit 1\n").expect("hook");
        std::process::Command::new("chmod")
            .arg("+x")
            .arg(&hook)
            .status()
            .expect("chmod");
        let pack = Command::new("git")
            .current_dir(&dir)
            .args(["pack-objects", "-q", "--stdout"])
            .stdin(Stdio::null())
            .output()
            .expect("empty pack");
        Self {
            dir,
            hexsz: c1.len(),
            c1,
            c2,
            empty_pack: pack.stdout,
        }
    }

    /// Run `git receive-pack` on `stream`: the updates its pre-receive hook was given, and its
    /// input as it came.
    fn receive(&self, stream: &[u8], out: &Path) -> (Vec<RefUpdate>, Vec<u8>) {
        let _ = std::fs::remove_file(out);
        let mut child = Command::new("git")
            .arg("receive-pack")
            .arg(&self.dir)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("HOME", &self.dir)
            .env("SVC_DIFF_OUT", out)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("git receive-pack");
        let mut stdin = child.stdin.take().expect("stdin");
        let bytes = stream.to_vec();
        // git may stop reading (and die) early: write from a thread, ignore a broken pipe.
        let writer = std::thread::spawn(move || {
            let _ = stdin.write_all(&bytes);
        });
        let _ = child.wait_with_output().expect("wait");
        let _ = writer.join();
        let Ok(seen) = std::fs::read(out) else {
            return (Vec::new(), Vec::new());
        };
        let updates = seen
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| {
                let l = String::from_utf8_lossy(l);
                let mut p = l.splitn(3, ' ');
                RefUpdate {
                    old: p.next().unwrap_or_default().to_owned(),
                    new: p.next().unwrap_or_default().to_owned(),
                    name: p.next().unwrap_or_default().to_owned(),
                }
            })
            .collect();
        (updates, seen)
    }

    fn id(&self, word: &str) -> String {
        match word {
            "C1" => self.c1.clone(),
            "C2" => self.c2.clone(),
            "C2U" => self.c2.to_ascii_uppercase(),
            "ZERO" => "0".repeat(self.hexsz),
            "FMT" if self.hexsz == 40 => "sha1".into(),
            "FMT" => "sha256".into(),
            _ => "e".repeat(self.hexsz),
        }
    }
}

/// One piece of a stream, before the repository's ids are put in.
#[derive(Debug, Clone)]
enum Piece {
    /// A pkt-line's payload (`{C1}`-style words replaced by ids).
    Pkt(Vec<u8>),
    Flush,
    Delim,
    End,
    Pack,
}

fn render(pieces: &[Piece], repo: &Repo) -> Vec<u8> {
    let mut out = Vec::new();
    for p in pieces {
        match p {
            Piece::Pkt(payload) => {
                let mut text = payload.clone();
                for w in ["C1", "C2U", "C2", "ZERO", "X", "FMT"] {
                    text = replace(&text, format!("{{{w}}}").as_bytes(), repo.id(w).as_bytes());
                }
                out.extend(format!("{:04x}", text.len() + 4).into_bytes());
                out.extend(text);
            }
            Piece::Flush => out.extend(b"0000"),
            Piece::Delim => out.extend(b"0001"),
            Piece::End => out.extend(b"0002"),
            Piece::Pack => out.extend(&repo.empty_pack),
        }
    }
    out
}

fn replace(hay: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(hay.len());
    let mut i = 0;
    while i < hay.len() {
        if hay[i..].starts_with(from) {
            out.extend_from_slice(to);
            i += from.len();
        } else {
            out.push(hay[i]);
            i += 1;
        }
    }
    out
}

/// A corpus file: one piece a line (see the corpus's README).
fn parse_corpus(text: &str) -> Vec<Piece> {
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        out.push(match line {
            "FLUSH" => Piece::Flush,
            "DELIM" => Piece::Delim,
            "END" => Piece::End,
            "PACK" => Piece::Pack,
            "EMPTY" => Piece::Pkt(Vec::new()),
            l => Piece::Pkt(unescape(l)),
        });
    }
    out
}

fn unescape(l: &str) -> Vec<u8> {
    let mut out = Vec::new();
    let mut bytes = l.bytes();
    while let Some(b) = bytes.next() {
        if b != b'\\' {
            out.push(b);
            continue;
        }
        out.push(match bytes.next() {
            Some(b'n') => b'\n',
            Some(b'r') => b'\r',
            Some(b't') => b'\t',
            Some(b'0') => 0,
            Some(b'\\') => b'\\',
            other => panic!("bad escape {other:?} in {l:?}"),
        });
    }
    out
}

/// What svc made of a stream fed in pieces of random sizes (as the relay's reads come).
enum Svc {
    Allowed(Vec<RefUpdate>),
    Refused,
}

fn svc_decides(stream: &[u8], rng: &mut Rng) -> Svc {
    let branches = vec![BRANCHES.to_owned()];
    let mut end = 0;
    while end < stream.len() {
        end = (end + 1 + rng.below(64)).min(stream.len());
        match ssh::parse_push(&stream[..end]) {
            Ok(None) => {}
            Ok(Some(push)) => {
                return match ssh::first_refused(&branches, &push.updates) {
                    Some(_) => Svc::Refused,
                    None => Svc::Allowed(push.updates),
                };
            }
            Err(_) => return Svc::Refused,
        }
    }
    // The relay forwards nothing of a list that never ends.
    Svc::Refused
}

#[derive(Default, Debug)]
struct Tally {
    cases: usize,
    hook_ran: usize,
    allowed: usize,
    refused: usize,
    agreed: usize,
}

/// Run one stream both ways and check the property; the outcome for the tally.
fn one(name: &str, pieces: &[Piece], repo: &Repo, out: &Path, rng: &mut Rng, t: &mut Tally) {
    let stream = render(pieces, repo);
    let (git_saw, raw) = repo.receive(&stream, out);
    let svc = svc_decides(&stream, rng);
    t.cases += 1;
    t.hook_ran += usize::from(!git_saw.is_empty());
    // svc's model of git's reading (what the audit names) is git's, byte for byte as the
    // hook got it, whenever git's hook ran.
    let (model, _) = ssh::git_reading(&stream);
    if !git_saw.is_empty() {
        let as_hook: String = model
            .iter()
            .map(|u| format!("{} {} {}\n", u.old, u.new, u.name))
            .collect();
        assert_eq!(
            as_hook,
            String::from_utf8_lossy(&raw),
            "{name}: svc's model of git's reading differs from git's; stream {:?}",
            String::from_utf8_lossy(&stream)
        );
    }
    match &svc {
        Svc::Refused => t.refused += 1,
        Svc::Allowed(read) => {
            t.allowed += 1;
            for u in &git_saw {
                assert!(
                    read.contains(u),
                    "{name}: git would apply {u:?}, which svc did not read (svc read \
                     {read:?}); stream {:?}",
                    String::from_utf8_lossy(&stream)
                );
            }
            if !git_saw.is_empty() && git_saw == *read {
                t.agreed += 1;
            }
        }
    }
}

#[test]
fn git_receive_pack_applies_no_ref_the_relay_did_not_check() {
    let root = svc_tests::fresh_dir("srd");
    let repos = [Repo::new(&root, "sha1"), Repo::new(&root, "sha256")];
    let out = root.join("hook.out");
    let mut rng = Rng(1);
    let mut t = Tally::default();

    // The seed corpus, each against both hashes.
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/receive-pack");
    let mut files: Vec<_> = std::fs::read_dir(&corpus)
        .expect("corpus")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "pkt"))
        .collect();
    files.sort();
    assert!(files.len() >= 15, "the corpus is missing: {corpus:?}");
    for file in &files {
        let name = file
            .file_name()
            .expect("name")
            .to_string_lossy()
            .into_owned();
        let pieces = parse_corpus(&std::fs::read_to_string(file).expect("corpus file"));
        for repo in &repos {
            let stream = render(&pieces, repo);
            let before = (t.hook_ran, t.agreed);
            one(&name, &pieces, repo, &out, &mut rng, &mut t);
            // The attack streams really move main in git; the good ones pass svc whole.
            if name.starts_with("attack") {
                assert_eq!(
                    t.hook_ran,
                    before.0 + 1,
                    "{name}: git did not take the attack"
                );
            }
            if name.ends_with("-good.pkt") {
                assert_eq!(
                    t.agreed,
                    before.1 + 1,
                    "{name}: git and svc did not agree on a legitimate push: {:?}",
                    String::from_utf8_lossy(&stream)
                );
            }
        }
    }

    // Generated streams.
    let cases: usize = std::env::var("SVC_DIFF_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1500);
    let seed: u64 = std::env::var("SVC_DIFF_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x5eed);
    for i in 0..cases as u64 {
        let mut rng = Rng(seed.wrapping_add(i).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let pieces = generate(&mut rng);
        let repo = &repos[usize::from(rng.below(4) == 0)];
        one(
            &format!("seed {}", seed.wrapping_add(i)),
            &pieces,
            repo,
            &out,
            &mut rng,
            &mut t,
        );
    }
    eprintln!("{t:?}");
    // Not vacuous: git took many of the streams, and svc allowed and agreed on many.
    assert!(
        t.hook_ran * 5 >= t.cases,
        "git's hook ran too seldom: {t:?}"
    );
    assert!(
        t.agreed * 15 >= t.cases,
        "svc and git agreed too seldom: {t:?}"
    );
    let _ = std::fs::remove_dir_all(&root);
}

/// splitmix64: a seeded generator that needs no crate.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn pick<'a, T>(&mut self, v: &'a [T]) -> &'a T {
        &v[self.below(v.len())]
    }

    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }
}

#[path = "git_receive_differential/generate.rs"]
mod generate;
use generate::generate;

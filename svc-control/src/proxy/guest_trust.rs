//! The sandbox CA in the guest: its certificate into the guest's trust store, and the variables
//! that point the usual clients at it.
//!
//! The CA certificate (never its key) is written as its own file under
//! `/usr/local/share/ca-certificates/` and appended, between markers, to the distribution bundle
//! `/etc/ssl/certs/ca-certificates.crt`, so clients that read the system store trust it and a
//! later `update-ca-certificates` in the guest keeps it. Installing again replaces the previous
//! block (a restarted sandbox has a new CA); everything else in the bundle is kept byte for byte.
//! Each file is written to a temporary name and renamed, so a crash leaves the old or the new
//! file, never half of one.

use std::{
    io::Write as _,
    path::{Path, PathBuf},
};

/// The CA certificate on its own, in the guest.
pub const GUEST_CA_FILE: &str = "/usr/local/share/ca-certificates/svc-sandbox-ca.crt";
/// The distribution CA bundle, in the guest.
pub const GUEST_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

const BEGIN: &str = "# svc sandbox CA: begin (managed by svcd, replaced at every sandbox start)\n";
const END: &str = "# svc sandbox CA: end\n";

/// The variables the guest environment gets, name and value.
///
/// `NODE_EXTRA_CA_CERTS` names the CA alone (Node adds it to its built-in roots); the others name
/// the whole bundle, because they replace the client's roots rather than add to them.
pub fn guest_env() -> [(&'static str, &'static str); 5] {
    [
        ("SSL_CERT_FILE", GUEST_BUNDLE),
        ("NODE_EXTRA_CA_CERTS", GUEST_CA_FILE),
        ("REQUESTS_CA_BUNDLE", GUEST_BUNDLE),
        ("CURL_CA_BUNDLE", GUEST_BUNDLE),
        ("GIT_SSL_CAINFO", GUEST_BUNDLE),
    ]
}

/// Errors installing the CA into a guest root.
#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    #[error("the sandbox CA is not a single PEM certificate")]
    NotACertificate,
    #[error("the guest bundle {path} has an svc block with no end marker; refusing to guess")]
    BrokenBlock { path: PathBuf },
    #[error("reading {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("writing {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Install `ca_pem` into the guest root file system at `root`.
pub fn install(root: &Path, ca_pem: &str) -> Result<(), TrustError> {
    let pem = ca_pem.trim();
    if !(pem.starts_with("-----BEGIN CERTIFICATE-----")
        && pem.ends_with("-----END CERTIFICATE-----")
        && pem.matches("-----BEGIN").count() == 1)
    {
        return Err(TrustError::NotACertificate);
    }
    let ca_file = under(root, GUEST_CA_FILE);
    write_atomic(&ca_file, format!("{pem}\n").as_bytes())?;
    let bundle = under(root, GUEST_BUNDLE);
    let existing = match std::fs::read_to_string(&bundle) {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(source) => {
            return Err(TrustError::Read {
                path: bundle,
                source,
            });
        }
    };
    let next = with_block(&existing, pem).ok_or_else(|| TrustError::BrokenBlock {
        path: bundle.clone(),
    })?;
    write_atomic(&bundle, next.as_bytes())
}

/// `bundle` with any previous svc block removed and a new one for `pem` appended.
fn with_block(bundle: &str, pem: &str) -> Option<String> {
    let mut out = String::with_capacity(bundle.len() + pem.len() + BEGIN.len() + END.len() + 2);
    let mut rest = bundle;
    while let Some(start) = rest.find(BEGIN) {
        let after = &rest[start + BEGIN.len()..];
        let end = after.find(END)?;
        out.push_str(&rest[..start]);
        rest = &after[end + END.len()..];
    }
    out.push_str(rest);
    if !out.is_empty() && !out.ends_with('\n') {
        out.push('\n');
    }
    out.push_str(BEGIN);
    out.push_str(pem);
    out.push('\n');
    out.push_str(END);
    Some(out)
}

fn under(root: &Path, guest_path: &str) -> PathBuf {
    root.join(guest_path.trim_start_matches('/'))
}

fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), TrustError> {
    let err = |source| TrustError::Write {
        path: path.to_owned(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(err)?;
    }
    let tmp = path.with_extension("svc-tmp");
    let mut f = std::fs::File::create(&tmp).map_err(err)?;
    f.write_all(bytes).map_err(err)?;
    f.sync_all().map_err(err)?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----";
    const B: &str = "-----BEGIN CERTIFICATE-----\nBBBB\n-----END CERTIFICATE-----";
    const SYSTEM: &str = "-----BEGIN CERTIFICATE-----\nSYS1\n-----END CERTIFICATE-----\n";

    #[test]
    fn block_cases() {
        let cases: &[(&str, &str, &str, Option<&str>)] = &[
            ("empty bundle", "", A, Some(&format!("{BEGIN}{A}\n{END}"))),
            (
                "appended after the system roots",
                SYSTEM,
                A,
                Some(&format!("{SYSTEM}{BEGIN}{A}\n{END}")),
            ),
            (
                "no trailing newline in the bundle",
                SYSTEM.trim_end(),
                A,
                Some(&format!("{SYSTEM}{BEGIN}{A}\n{END}")),
            ),
            (
                "a previous block is replaced, not kept",
                &format!("{SYSTEM}{BEGIN}{A}\n{END}"),
                B,
                Some(&format!("{SYSTEM}{BEGIN}{B}\n{END}")),
            ),
            (
                "a block in the middle is moved to the end",
                &format!("{BEGIN}{A}\n{END}{SYSTEM}"),
                B,
                Some(&format!("{SYSTEM}{BEGIN}{B}\n{END}")),
            ),
            (
                "an unterminated block is refused",
                &format!("{SYSTEM}{BEGIN}{A}\n"),
                B,
                None,
            ),
        ];
        for (name, bundle, pem, want) in cases {
            assert_eq!(with_block(bundle, pem).as_deref(), *want, "{name}");
        }
    }

    #[test]
    fn install_is_idempotent_and_refuses_non_certificates() {
        let root = std::env::temp_dir().join(format!("svc-trust-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let bundle = under(&root, GUEST_BUNDLE);
        std::fs::create_dir_all(bundle.parent().unwrap()).unwrap();
        std::fs::write(&bundle, SYSTEM).unwrap();
        install(&root, A).unwrap();
        install(&root, B).unwrap();
        install(&root, B).unwrap();
        let got = std::fs::read_to_string(&bundle).unwrap();
        assert_eq!(got, format!("{SYSTEM}{BEGIN}{B}\n{END}"));
        assert_eq!(
            std::fs::read_to_string(under(&root, GUEST_CA_FILE)).unwrap(),
            format!("{B}\n")
        );
        for bad in [
            "",
            "not a cert",
            &format!("{A}\n{B}"),
            "-----BEGIN PRIVATE KEY-----\nx\n-----END PRIVATE KEY-----",
        ] {
            assert!(
                matches!(install(&root, bad), Err(TrustError::NotACertificate)),
                "{bad:?}"
            );
        }
        assert_eq!(
            std::fs::read_to_string(&bundle).unwrap(),
            got,
            "a refusal writes nothing"
        );
        std::fs::remove_dir_all(&root).unwrap();
    }
}

//! The sandbox CA in the guest: its certificate into the guest's trust store, and the variables
//! that point the usual clients at it.
//!
//! The CA certificate (never its key) is written as its own file under
//! `/usr/local/share/ca-certificates/` and appended, between markers, to the distribution bundle
//! `/etc/ssl/certs/ca-certificates.crt`, so clients that read the system store trust it and a
//! later `update-ca-certificates` in the guest keeps it. Making them again replaces the previous
//! block (a restarted sandbox has a new CA); everything else in the bundle is kept byte for byte.
//! [`trust_files`] makes the two files' contents; svcd writes them into the sandbox's directory
//! (a sandbox's own files, made again whenever it is: no fsync, no rename).

use std::path::PathBuf;

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

/// Why the guest's trust files could not be made.
#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    #[error("the sandbox CA is not a single PEM certificate")]
    NotACertificate,
    #[error("the guest bundle {path} has an svc block with no end marker; refusing to guess")]
    BrokenBlock { path: PathBuf },
}

/// The two guest files that make a guest trust `ca_pem`: the CA file on its own
/// ([`GUEST_CA_FILE`]) and `system_bundle` (the distribution bundle) with the svc block for it
/// ([`GUEST_BUNDLE`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrustFiles {
    pub ca_file: String,
    pub bundle: String,
}

/// The guest's trust files for `ca_pem` over `system_bundle` (see [`TrustFiles`]); refused when
/// `ca_pem` is not a single PEM certificate or the bundle has an svc block with no end.
pub fn trust_files(system_bundle: &str, ca_pem: &str) -> Result<TrustFiles, TrustError> {
    let pem = ca_pem.trim();
    if !(pem.starts_with("-----BEGIN CERTIFICATE-----")
        && pem.ends_with("-----END CERTIFICATE-----")
        && pem.matches("-----BEGIN").count() == 1)
    {
        return Err(TrustError::NotACertificate);
    }
    let bundle = with_block(system_bundle, pem).ok_or_else(|| TrustError::BrokenBlock {
        path: PathBuf::from(GUEST_BUNDLE),
    })?;
    Ok(TrustFiles {
        ca_file: format!("{pem}\n"),
        bundle,
    })
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
    fn trust_files_replace_the_block_and_refuse_non_certificates() {
        let once = trust_files(SYSTEM, A).unwrap();
        let twice = trust_files(&once.bundle, B).unwrap();
        assert_eq!(twice.bundle, format!("{SYSTEM}{BEGIN}{B}\n{END}"));
        assert_eq!(trust_files(&twice.bundle, B).unwrap(), twice, "idempotent");
        assert_eq!(twice.ca_file, format!("{B}\n"));
        for bad in [
            "",
            "not a cert",
            &format!("{A}\n{B}"),
            "-----BEGIN PRIVATE KEY-----\nx\n-----END PRIVATE KEY-----",
        ] {
            assert!(
                matches!(trust_files(SYSTEM, bad), Err(TrustError::NotACertificate)),
                "{bad:?}"
            );
        }
        let broken = format!("{SYSTEM}{BEGIN}{A}\n");
        assert!(matches!(
            trust_files(&broken, B),
            Err(TrustError::BrokenBlock { .. })
        ));
    }
}

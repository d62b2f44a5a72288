//! Values at rest: sealed with the host key (ChaCha20-Poly1305 from RustCrypto; a fresh random
//! 96-bit nonce per value; what the value is — the store's secret name, or a sandbox and its
//! variable — as associated data, so a sealed value moved to another row does not open).
//! The key is a file of 32 random bytes, root's and readable by root alone, made on first use.

use std::{
    io::{Read as _, Write as _},
    os::unix::fs::{MetadataExt as _, OpenOptionsExt as _},
    path::{Path, PathBuf},
};

use chacha20poly1305::{
    ChaCha20Poly1305, Key, KeyInit as _, Nonce,
    aead::{Aead as _, Payload},
};
use zeroize::Zeroizing;

/// Bytes of a nonce, written before the ciphertext.
const NONCE: usize = 12;

/// What is wrong with the key or a sealed value (never the value itself).
#[derive(Debug, thiserror::Error)]
pub enum SealError {
    #[error("the host key {path}: {why}")]
    Key { path: PathBuf, why: String },
    #[error(
        "a sealed value of {what} does not open with this host's key (a different key, or the value was changed)"
    )]
    Open { what: String },
    #[error("no randomness: {0}")]
    Random(String),
}

/// The host key.
pub struct HostKey {
    key: Zeroizing<[u8; 32]>,
}

impl std::fmt::Debug for HostKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HostKey(..)")
    }
}

impl HostKey {
    /// The key at `path`: made (32 random bytes, mode 0600) if it is not there; refused if it
    /// is not root's alone or not 32 bytes.
    pub fn load_or_create(path: &Path) -> Result<Self, SealError> {
        let err = |why: String| SealError::Key {
            path: path.to_owned(),
            why,
        };
        if !path.exists() {
            let mut key = Zeroizing::new([0u8; 32]);
            getrandom::fill(&mut key[..]).map_err(|e| SealError::Random(e.to_string()))?;
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).map_err(|e| err(e.to_string()))?;
            }
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)
                .map_err(|e| err(format!("creating it: {e}")))?;
            f.write_all(&key[..])
                .and_then(|()| f.sync_all())
                .map_err(|e| err(format!("writing it: {e}")))?;
            return Ok(Self { key });
        }
        let meta = std::fs::metadata(path).map_err(|e| err(e.to_string()))?;
        if meta.uid() != 0 || meta.mode() & 0o077 != 0 {
            return Err(err(format!(
                "must be owned by root and readable by root alone (chown root {0}; chmod 600 {0})",
                path.display()
            )));
        }
        let mut key = Zeroizing::new([0u8; 32]);
        let mut f = std::fs::File::open(path).map_err(|e| err(e.to_string()))?;
        f.read_exact(&mut key[..])
            .map_err(|_| err("expected 32 bytes".into()))?;
        let mut more = [0u8; 1];
        if f.read(&mut more).map_err(|e| err(e.to_string()))? != 0 {
            return Err(err("expected 32 bytes".into()));
        }
        Ok(Self { key })
    }

    fn cipher(&self) -> ChaCha20Poly1305 {
        ChaCha20Poly1305::new(Key::from_slice(&self.key[..]))
    }

    /// `value` sealed for `what`: nonce, then ciphertext and tag.
    pub fn seal(&self, what: &str, value: &[u8]) -> Result<Vec<u8>, SealError> {
        let mut nonce = [0u8; NONCE];
        getrandom::fill(&mut nonce).map_err(|e| SealError::Random(e.to_string()))?;
        let sealed = self
            .cipher()
            .encrypt(
                Nonce::from_slice(&nonce),
                Payload {
                    msg: value,
                    aad: what.as_bytes(),
                },
            )
            .map_err(|_| SealError::Random("sealing failed".into()))?;
        let mut out = nonce.to_vec();
        out.extend_from_slice(&sealed);
        Ok(out)
    }

    /// The value `sealed` holds, if it was sealed for `what` with this key.
    pub fn open(&self, what: &str, sealed: &[u8]) -> Result<Zeroizing<Vec<u8>>, SealError> {
        let fail = || SealError::Open {
            what: what.to_owned(),
        };
        if sealed.len() < NONCE + 16 {
            return Err(fail());
        }
        let (nonce, body) = sealed.split_at(NONCE);
        self.cipher()
            .decrypt(
                Nonce::from_slice(nonce),
                Payload {
                    msg: body,
                    aad: what.as_bytes(),
                },
            )
            .map(Zeroizing::new)
            .map_err(|_| fail())
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    #[test]
    fn values_open_only_with_their_key_and_their_name() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("key");
        let key = HostKey::load_or_create(&path).expect("made");
        assert_eq!(
            std::fs::metadata(&path).expect("meta").permissions().mode() & 0o777,
            0o600
        );
        let sealed = key.seal("store:gh", b"real-token").expect("seal");
        assert!(
            !sealed.windows(10).any(|w| w == b"real-token"),
            "the value is not in the sealed bytes"
        );
        assert_eq!(
            &key.open("store:gh", &sealed).expect("opens")[..],
            b"real-token"
        );
        // The same key read back from its file opens it; two seals differ (fresh nonces).
        let again = HostKey::load_or_create(&path).expect("loaded");
        assert_eq!(
            &again.open("store:gh", &sealed).expect("opens")[..],
            b"real-token"
        );
        assert_ne!(key.seal("store:gh", b"real-token").expect("seal"), sealed);
        // Another name, a changed byte, a cut value, another key: refused, naming only `what`.
        let e = key.open("store:other", &sealed).expect_err("other name");
        assert!(e.to_string().contains("store:other"), "{e}");
        let mut changed = sealed.clone();
        if let Some(b) = changed.last_mut() {
            *b ^= 1;
        }
        assert!(key.open("store:gh", &changed).is_err());
        assert!(key.open("store:gh", &sealed[..10]).is_err());
        let other = HostKey::load_or_create(&dir.path().join("other")).expect("other key");
        assert!(other.open("store:gh", &sealed).is_err());
        assert!(
            !format!("{key:?}").contains(char::is_numeric),
            "no key bytes in Debug"
        );
    }

    #[test]
    fn a_key_file_others_can_read_or_of_the_wrong_size_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("key");
        std::fs::write(&path, [7u8; 32]).expect("write");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let e = HostKey::load_or_create(&path).expect_err("world-readable");
        assert!(e.to_string().contains("chmod 600"), "{e}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        assert!(HostKey::load_or_create(&path).is_ok());
        std::fs::write(&path, [7u8; 31]).expect("write");
        let e = HostKey::load_or_create(&path).expect_err("short");
        assert!(e.to_string().contains("32 bytes"), "{e}");
        std::fs::write(&path, [7u8; 33]).expect("write");
        assert!(HostKey::load_or_create(&path).is_err(), "long");
    }
}

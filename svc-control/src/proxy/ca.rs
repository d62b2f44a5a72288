//! A CA per sandbox: created at sandbox start, its private key never leaves the host; its
//! certificate goes into the guest's trust store. Leaf certificates are minted per server name
//! on first use and cached; all leaves of one CA share one leaf key (minting is then one
//! signature, not a key generation).

use std::{
    collections::HashMap,
    net::IpAddr,
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use rustls::{
    pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer},
    sign::CertifiedKey,
};

/// How long a sandbox CA is valid. Sandboxes are recreated long before.
const CA_VALIDITY: Duration = Duration::from_secs(366 * 24 * 3600);
/// How long a leaf is valid.
const LEAF_VALIDITY: Duration = Duration::from_secs(90 * 24 * 3600);
/// Leaves cached per CA before the cache is cleared (a sandbox reaches a handful of names).
const MAX_CACHED_LEAVES: usize = 4096;

/// Errors of the CA.
#[derive(Debug, thiserror::Error)]
pub enum CaError {
    #[error("generating a key for {what}")]
    Key {
        what: &'static str,
        #[source]
        source: rcgen::Error,
    },
    #[error("signing the certificate for {subject}")]
    Sign {
        subject: String,
        #[source]
        source: rcgen::Error,
    },
    #[error("the stored CA certificate does not parse: {0}")]
    Stored(String),
    #[error("loading the leaf key into rustls")]
    LoadKey(#[source] rustls::Error),
}

/// One sandbox's CA.
pub struct SandboxCa {
    issuer: Issuer<'static, KeyPair>,
    cert_der: CertificateDer<'static>,
    cert_pem: String,
    leaf_key: KeyPair,
    signing_key: Arc<dyn rustls::sign::SigningKey>,
    leaves: Mutex<HashMap<String, Arc<CertifiedKey>>>,
    /// One TLS server configuration per name, kept so its session cache lets a reconnecting
    /// guest resume instead of paying a full handshake.
    configs: Mutex<HashMap<String, Arc<rustls::ServerConfig>>>,
}

impl std::fmt::Debug for SandboxCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxCa").finish_non_exhaustive()
    }
}

/// The CA's parameters; everything a leaf's issuer fields derive from is fixed by `name`, so
/// a CA restored from its key and certificate issues leaves its certificate verifies.
fn ca_params(name: &str, now: SystemTime) -> CertificateParams {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, format!("svc sandbox {name} CA"));
    dn.push(DnType::OrganizationName, "svc egress perimeter");
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.not_before = (now - Duration::from_secs(3600)).into();
    params.not_after = (now + CA_VALIDITY).into();
    params
}

impl SandboxCa {
    /// Generate a CA for sandbox `name` (ECDSA P-256).
    pub fn generate(name: &str) -> Result<Self, CaError> {
        let ca_key = KeyPair::generate().map_err(|source| CaError::Key {
            what: "the CA",
            source,
        })?;
        let cert = ca_params(name, SystemTime::now())
            .self_signed(&ca_key)
            .map_err(|source| CaError::Sign {
                subject: format!("the CA of {name}"),
                source,
            })?;
        Self::assemble(name, ca_key, cert.der().clone(), cert.pem())
    }

    /// The CA of sandbox `name` again, from the certificate and key svcd stored when it was
    /// generated (after a supervisor restart the guest still trusts the same certificate).
    pub fn restore(name: &str, cert_pem: &str, key_pem: &str) -> Result<Self, CaError> {
        let ca_key = KeyPair::from_pem(key_pem).map_err(|source| CaError::Key {
            what: "the stored CA",
            source,
        })?;
        let der = rustls::pki_types::pem::PemObject::from_pem_slice(cert_pem.as_bytes())
            .map_err(|e| CaError::Stored(e.to_string()))?;
        Self::assemble(name, ca_key, der, cert_pem.to_owned())
    }

    fn assemble(
        name: &str,
        ca_key: KeyPair,
        cert_der: CertificateDer<'static>,
        cert_pem: String,
    ) -> Result<Self, CaError> {
        let issuer = Issuer::new(ca_params(name, SystemTime::now()), ca_key);
        let leaf_key = KeyPair::generate().map_err(|source| CaError::Key {
            what: "the leaves",
            source,
        })?;
        let der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der()));
        let signing_key =
            rustls::crypto::ring::sign::any_supported_type(&der).map_err(CaError::LoadKey)?;
        Ok(Self {
            issuer,
            cert_der,
            cert_pem,
            leaf_key,
            signing_key,
            leaves: Mutex::default(),
            configs: Mutex::default(),
        })
    }

    /// The CA certificate, PEM, for the guest's trust store.
    pub fn ca_pem(&self) -> String {
        self.cert_pem.clone()
    }

    /// The CA's private key, PEM, for svcd's state database (root-only); never for the guest.
    pub fn ca_key_pem(&self) -> String {
        self.issuer.key().serialize_pem()
    }

    /// The CA certificate, DER.
    pub fn ca_der(&self) -> CertificateDer<'static> {
        self.cert_der.clone()
    }

    /// The leaf for `server_name` (a normalised DNS name or an IP literal), minted on first use.
    pub fn leaf_for(&self, server_name: &str) -> Result<Arc<CertifiedKey>, CaError> {
        if let Some(leaf) = self
            .leaves
            .lock()
            .ok()
            .and_then(|l| l.get(server_name).cloned())
        {
            return Ok(leaf);
        }
        let now = SystemTime::now();
        let mut params = CertificateParams::default();
        params.subject_alt_names = vec![match server_name.parse::<IpAddr>() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) => SanType::DnsName(server_name.to_owned().try_into().map_err(|source| {
                CaError::Sign {
                    subject: server_name.to_owned(),
                    source,
                }
            })?),
        }];
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, server_name);
        params.distinguished_name = dn;
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.not_before = (now - Duration::from_secs(3600)).into();
        params.not_after = (now + LEAF_VALIDITY).into();
        let cert = params
            .signed_by(&self.leaf_key, &self.issuer)
            .map_err(|source| CaError::Sign {
                subject: server_name.to_owned(),
                source,
            })?;
        let leaf = Arc::new(CertifiedKey::new(
            vec![cert.der().clone(), self.ca_der()],
            self.signing_key.clone(),
        ));
        if let Ok(mut leaves) = self.leaves.lock() {
            if leaves.len() >= MAX_CACHED_LEAVES {
                leaves.clear();
            }
            leaves.insert(server_name.to_owned(), leaf.clone());
        }
        Ok(leaf)
    }

    /// The TLS server configuration that presents exactly `server_name`'s leaf (ALPN h2,
    /// http/1.1), built on first use and cached with its session cache.
    pub fn server_config(&self, server_name: &str) -> Result<Arc<rustls::ServerConfig>, CaError> {
        if let Some(c) = self
            .configs
            .lock()
            .ok()
            .and_then(|c| c.get(server_name).cloned())
        {
            return Ok(c);
        }
        let leaf = self.leaf_for(server_name)?;
        let mut cfg = rustls::ServerConfig::builder_with_provider(super::crypto_provider())
            .with_safe_default_protocol_versions()
            .map_err(CaError::LoadKey)?
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(OneLeaf(leaf)));
        cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        // The provider's order (AES-128-GCM/SHA-256 first), not the guest's.
        cfg.ignore_client_order = true;
        let cfg = Arc::new(cfg);
        if let Ok(mut configs) = self.configs.lock() {
            if configs.len() >= MAX_CACHED_LEAVES {
                configs.clear();
            }
            configs.insert(server_name.to_owned(), cfg.clone());
        }
        Ok(cfg)
    }

    /// How many leaves are cached.
    pub fn cached_leaves(&self) -> usize {
        self.leaves.lock().map_or(0, |l| l.len())
    }
}

/// Presents one leaf whatever the ClientHello says (the name was checked before TLS started).
#[derive(Debug)]
struct OneLeaf(Arc<CertifiedKey>);

impl rustls::server::ResolvesServerCert for OneLeaf {
    fn resolve(&self, _: rustls::server::ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }
}

#[cfg(test)]
mod tests {
    use rustls::{
        client::{WebPkiServerVerifier, danger::ServerCertVerifier as _},
        pki_types::{ServerName, UnixTime},
    };

    use super::*;

    fn verifies(trusted: &CertificateDer<'static>, ca: &SandboxCa, name: &str) -> bool {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(trusted.clone()).unwrap();
        let verifier = WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            Arc::new(rustls::crypto::ring::default_provider()),
        )
        .build()
        .unwrap();
        let leaf = ca.leaf_for(name).unwrap();
        verifier
            .verify_server_cert(
                &leaf.cert[0],
                &leaf.cert[1..],
                &ServerName::try_from(name.to_owned()).unwrap(),
                &[],
                UnixTime::now(),
            )
            .is_ok()
    }

    #[test]
    fn a_restored_ca_issues_leaves_the_original_certificate_verifies() {
        let ca = SandboxCa::generate("dev").unwrap();
        let original = ca.ca_der();
        assert!(verifies(&original, &ca, "api.example.com"));
        let restored = SandboxCa::restore("dev", &ca.ca_pem(), &ca.ca_key_pem()).unwrap();
        assert_eq!(restored.ca_der(), original);
        assert!(verifies(&original, &restored, "api.example.com"));
        // Another sandbox's CA is not trusted for this one.
        let other = SandboxCa::generate("other").unwrap();
        assert!(!verifies(&original, &other, "api.example.com"));
    }

    #[test]
    fn a_guest_offering_aes_256_first_gets_aes_128_gcm_sha256() {
        let ca = SandboxCa::generate("dev").unwrap();
        let server_cfg = ca.server_config("api.example.com").unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.ca_der()).unwrap();
        // A client with rustls's default order: AES-256-GCM/SHA-384 first.
        let client_cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        assert_eq!(
            client_cfg.crypto_provider().cipher_suites[0].suite(),
            rustls::CipherSuite::TLS13_AES_256_GCM_SHA384
        );
        let mut client = rustls::Connection::from(
            rustls::ClientConnection::new(
                Arc::new(client_cfg),
                ServerName::try_from("api.example.com").unwrap(),
            )
            .unwrap(),
        );
        let mut server =
            rustls::Connection::from(rustls::ServerConnection::new(server_cfg).unwrap());
        // The handshake over memory: each side's output is the other's input.
        let transfer = |from: &mut rustls::Connection, to: &mut rustls::Connection| {
            let mut wire = Vec::new();
            while from.wants_write() {
                from.write_tls(&mut wire).unwrap();
            }
            if !wire.is_empty() {
                to.read_tls(&mut wire.as_slice()).unwrap();
                to.process_new_packets().unwrap();
            }
        };
        for _ in 0..10 {
            transfer(&mut client, &mut server);
            transfer(&mut server, &mut client);
            if !client.is_handshaking() && !server.is_handshaking() {
                break;
            }
        }
        assert!(!server.is_handshaking(), "the handshake did not finish");
        assert_eq!(
            server.negotiated_cipher_suite().map(|s| s.suite()),
            Some(rustls::CipherSuite::TLS13_AES_128_GCM_SHA256)
        );
    }

    #[test]
    fn a_bad_stored_ca_is_an_error() {
        let ca = SandboxCa::generate("dev").unwrap();
        assert!(SandboxCa::restore("dev", "not pem", &ca.ca_key_pem()).is_err());
        assert!(SandboxCa::restore("dev", &ca.ca_pem(), "not a key").is_err());
    }
}

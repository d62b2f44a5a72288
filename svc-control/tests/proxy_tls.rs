//! The proxy's TLS building blocks with real rustls on both ends: ClientHellos produced by a
//! real client are read correctly (and hostile ones refused without panicking), and the
//! per-sandbox CA mints leaves that a client trusting only that CA accepts.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a broken fixture should panic"
)]

use std::sync::Arc;

use proptest::prelude::*;
use rustls::{
    ClientConfig, ClientConnection, RootCertStore, ServerConfig, ServerConnection,
    pki_types::ServerName,
    server::{ClientHello, ResolvesServerCert},
    sign::CertifiedKey,
};
use svc_control::proxy::{
    ca::SandboxCa,
    client_hello::{self, HelloError},
};

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn client(roots: RootCertStore, sni: bool, alpn: &[&str]) -> ClientConfig {
    let mut c = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    c.enable_sni = sni;
    c.alpn_protocols = alpn.iter().map(|a| a.as_bytes().to_vec()).collect();
    c
}

/// The first flight of a real rustls client.
fn hello(name: &str, sni: bool, alpn: &[&str]) -> Vec<u8> {
    let mut conn = ClientConnection::new(
        Arc::new(client(RootCertStore::empty(), sni, alpn)),
        ServerName::try_from(name.to_owned()).unwrap(),
    )
    .unwrap();
    let mut out = Vec::new();
    while conn.wants_write() {
        conn.write_tls(&mut out).unwrap();
    }
    out
}

#[test]
fn real_client_hellos() {
    let h = client_hello::parse(&hello("api.example.com", true, &["h2", "http/1.1"])).unwrap();
    assert_eq!(h.server_name.as_deref(), Some("api.example.com"));
    assert_eq!(h.alpn, ["h2", "http/1.1"]);
    assert!(!h.ech);
    let no_sni = client_hello::parse(&hello("api.example.com", false, &[])).unwrap();
    assert_eq!(
        no_sni.server_name, None,
        "a hello without SNI is seen as such"
    );
    let ip = client_hello::parse(&hello("192.0.2.10", true, &[])).unwrap();
    assert_eq!(
        ip.server_name, None,
        "rustls sends no SNI for an IP literal"
    );
}

/// Append an extension to a real hello, fixing every length.
fn with_extension(mut hello: Vec<u8>, ty: u16, data: &[u8]) -> Vec<u8> {
    let mut ext = ty.to_be_bytes().to_vec();
    ext.extend_from_slice(&(data.len() as u16).to_be_bytes());
    ext.extend_from_slice(data);
    let add = ext.len();
    // record length (3..5), handshake length (6..9), extensions length (last field before them).
    let rec = u16::from_be_bytes([hello[3], hello[4]]) as usize + add;
    hello[3..5].copy_from_slice(&(rec as u16).to_be_bytes());
    let hs =
        (usize::from(hello[6]) << 16 | usize::from(hello[7]) << 8 | usize::from(hello[8])) + add;
    hello[6] = (hs >> 16) as u8;
    hello[7] = (hs >> 8) as u8;
    hello[8] = hs as u8;
    let mut i = 9 + 2 + 32;
    i += 1 + usize::from(hello[i]);
    i += 2 + usize::from(u16::from_be_bytes([hello[i], hello[i + 1]]));
    i += 1 + usize::from(hello[i]);
    let el = u16::from_be_bytes([hello[i], hello[i + 1]]) as usize + add;
    hello[i..i + 2].copy_from_slice(&(el as u16).to_be_bytes());
    let end = 5 + u16::from_be_bytes([hello[3], hello[4]]) as usize - add;
    hello.splice(end..end, ext);
    hello
}

#[test]
fn ech_and_esni_are_flagged() {
    let base = hello("api.example.com", true, &[]);
    assert!(
        client_hello::parse(&with_extension(base.clone(), 0xfe0d, &[0, 1, 2, 3]))
            .unwrap()
            .ech
    );
    assert!(
        client_hello::parse(&with_extension(base, 0xffce, &[9]))
            .unwrap()
            .ech
    );
}

#[test]
fn hostile_hellos_are_refused() {
    let base = hello("api.example.com", true, &[]);
    for cut in [0, 1, 4, 5, 10, base.len() - 1] {
        assert!(
            client_hello::parse(&base[..cut]).is_err(),
            "truncated at {cut}"
        );
    }
    assert_eq!(
        client_hello::parse(&base[..3]).unwrap_err(),
        HelloError::Incomplete
    );
    assert_eq!(
        client_hello::parse(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap_err(),
        HelloError::NotTls
    );
    let twice = with_extension(base.clone(), 0, &[0, 5, 0, 0, 2, b'e', b'v']);
    assert!(
        matches!(client_hello::parse(&twice), Err(HelloError::Malformed(_))),
        "two server_name extensions"
    );
    let mut huge = vec![22, 3, 1, 0x40, 0, 1, 0xff, 0xff, 0xff];
    huge.resize(5 + 0x4000, 0);
    assert_eq!(
        client_hello::parse(&huge).unwrap_err(),
        HelloError::TooLarge
    );
}

#[test]
fn a_hello_split_across_records_is_reassembled() {
    let base = hello("split.example.com", true, &[]);
    let body = &base[5..];
    let (a, b) = body.split_at(40);
    let mut split = vec![22, 3, 1];
    split.extend_from_slice(&(a.len() as u16).to_be_bytes());
    split.extend_from_slice(a);
    split.extend_from_slice(&[22, 3, 1]);
    split.extend_from_slice(&(b.len() as u16).to_be_bytes());
    split.extend_from_slice(b);
    assert_eq!(
        client_hello::parse(&split).unwrap().server_name.as_deref(),
        Some("split.example.com")
    );
    assert_eq!(
        client_hello::parse(&split[..50]).unwrap_err(),
        HelloError::Incomplete
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, failure_persistence: None, ..ProptestConfig::default() })]
    #[test]
    fn parse_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..600)) {
        let _ = client_hello::parse(&bytes);
    }
    #[test]
    fn flipped_real_hellos_never_panic(i in 0usize..200, b in any::<u8>()) {
        let mut h = hello("api.example.com", true, &["h2"]);
        let n = h.len();
        h[i % n] = b;
        let _ = client_hello::parse(&h);
    }
}

#[derive(Debug)]
struct ByName(Arc<SandboxCa>);
impl ResolvesServerCert for ByName {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.0.leaf_for(hello.server_name()?).ok()
    }
}

/// A full in-memory handshake; Ok when the client accepted the server's certificate.
fn handshake(ca: &Arc<SandboxCa>, trust: &SandboxCa, name: &str) -> Result<(), rustls::Error> {
    let mut roots = RootCertStore::empty();
    roots.add(trust.ca_der()).unwrap();
    let mut c = ClientConnection::new(
        Arc::new(client(roots, true, &[])),
        ServerName::try_from(name.to_owned()).unwrap(),
    )
    .unwrap();
    let sc = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(ByName(ca.clone())));
    let mut s = ServerConnection::new(Arc::new(sc)).unwrap();
    for _ in 0..10 {
        let mut buf = Vec::new();
        while c.wants_write() {
            c.write_tls(&mut buf).unwrap();
        }
        let mut rd = &buf[..];
        while !rd.is_empty() {
            s.read_tls(&mut rd).unwrap();
        }
        s.process_new_packets()?;
        let mut back = Vec::new();
        while s.wants_write() {
            s.write_tls(&mut back).unwrap();
        }
        let mut rd = &back[..];
        while !rd.is_empty() {
            c.read_tls(&mut rd).unwrap();
        }
        c.process_new_packets()?;
        if !c.is_handshaking() && !s.is_handshaking() {
            return Ok(());
        }
    }
    Err(rustls::Error::General("handshake did not finish".into()))
}

#[test]
fn leaves_are_trusted_only_through_their_own_ca_and_cached() {
    let ca = Arc::new(SandboxCa::generate("alpha").unwrap());
    let other = SandboxCa::generate("beta").unwrap();
    handshake(&ca, &ca, "api.example.com")
        .expect("a client trusting the sandbox CA accepts the leaf");
    handshake(&ca, &ca, "git.example.org").expect("a second name");
    assert!(
        handshake(&ca, &other, "api.example.com").is_err(),
        "another sandbox's CA does not vouch for it"
    );
    let first = ca.leaf_for("api.example.com").unwrap();
    let again = ca.leaf_for("api.example.com").unwrap();
    assert!(Arc::ptr_eq(&first, &again), "leaves are cached");
    assert_eq!(ca.cached_leaves(), 2);
    let ip = ca.leaf_for("192.0.2.10").unwrap();
    assert_eq!(ip.cert.len(), 2, "leaf and CA in the chain");
    assert!(ca.ca_pem().starts_with("-----BEGIN CERTIFICATE-----"));
}

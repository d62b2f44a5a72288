//! Reading a TLS ClientHello from the first bytes of a connection, before any TLS state exists:
//! the server name the guest asked for, whether it offered ECH, its ALPN list. Bounded: a
//! hello may span records but not more than 16 KiB; anything else is an error, never a panic.

/// Largest ClientHello accepted (handshake body bytes).
pub const MAX_HELLO: usize = 16 * 1024;

/// The ECH extension (RFC 9180 / draft-ietf-tls-esni): `encrypted_client_hello`.
const EXT_ECH: u16 = 0xfe0d;
/// The older ESNI extension.
const EXT_ESNI: u16 = 0xffce;
const EXT_SNI: u16 = 0;
const EXT_ALPN: u16 = 16;

/// What the proxy needs from a ClientHello.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HelloInfo {
    /// The `host_name` of the server_name extension, as sent (not normalised).
    pub server_name: Option<String>,
    /// The hello offers ECH or ESNI.
    pub ech: bool,
    pub alpn: Vec<String>,
}

/// Why a ClientHello could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HelloError {
    #[error("more bytes are needed")]
    Incomplete,
    #[error("not a TLS handshake")]
    NotTls,
    #[error("the first handshake message is not a ClientHello")]
    NotClientHello,
    #[error("the ClientHello is larger than 16 KiB")]
    TooLarge,
    #[error("malformed ClientHello: {0}")]
    Malformed(&'static str),
}

/// Parse the ClientHello at the start of `buf` (TLS records as received).
pub fn parse(buf: &[u8]) -> Result<HelloInfo, HelloError> {
    let hello = reassemble(buf)?;
    let mut r = Reader(&hello);
    if r.u8()? != 1 {
        return Err(HelloError::NotClientHello);
    }
    let len = r.u24()?;
    let mut body = Reader(r.take(len)?);
    body.take(2)?; // legacy_version
    body.take(32)?; // random
    let sid = usize::from(body.u8()?);
    body.take(sid)?;
    let suites = usize::from(body.u16()?);
    body.take(suites)?;
    let comp = usize::from(body.u8()?);
    body.take(comp)?;
    let mut info = HelloInfo::default();
    if body.0.is_empty() {
        return Ok(info); // no extensions at all
    }
    let ext_len = usize::from(body.u16()?);
    let mut exts = Reader(body.take(ext_len)?);
    let mut seen_sni = false;
    while !exts.0.is_empty() {
        let ty = exts.u16()?;
        let len = usize::from(exts.u16()?);
        let data = exts.take(len)?;
        match ty {
            EXT_SNI => {
                if seen_sni {
                    return Err(HelloError::Malformed("two server_name extensions"));
                }
                seen_sni = true;
                info.server_name = server_name(data)?;
            }
            EXT_ECH | EXT_ESNI => info.ech = true,
            EXT_ALPN => info.alpn = alpn(data)?,
            _ => {}
        }
    }
    Ok(info)
}

/// Collect the first handshake message from consecutive handshake records.
fn reassemble(buf: &[u8]) -> Result<Vec<u8>, HelloError> {
    let mut out = Vec::new();
    let mut r = Reader(buf);
    loop {
        if r.0.len() < 5 {
            return Err(HelloError::Incomplete);
        }
        let ct = r.u8()?;
        let major = r.u8()?;
        let _minor = r.u8()?;
        if ct != 22 || major != 3 {
            return Err(HelloError::NotTls);
        }
        let len = usize::from(r.u16()?);
        if len == 0 || len > 16_384 + 2048 {
            return Err(HelloError::Malformed("bad record length"));
        }
        let frag = r.take(len).map_err(|_| HelloError::Incomplete)?;
        out.extend_from_slice(frag);
        if out.len() > MAX_HELLO + 4 {
            return Err(HelloError::TooLarge);
        }
        if out.len() >= 4 {
            let need =
                4 + (usize::from(out[1]) << 16 | usize::from(out[2]) << 8 | usize::from(out[3]));
            if need > MAX_HELLO + 4 {
                return Err(HelloError::TooLarge);
            }
            if out.len() >= need {
                out.truncate(need);
                return Ok(out);
            }
        }
    }
}

fn server_name(data: &[u8]) -> Result<Option<String>, HelloError> {
    let mut r = Reader(data);
    let list_len = usize::from(r.u16()?);
    let mut list = Reader(r.take(list_len)?);
    let mut name = None;
    while !list.0.is_empty() {
        let ty = list.u8()?;
        let len = usize::from(list.u16()?);
        let raw = list.take(len)?;
        if ty == 0 {
            if name.is_some() {
                return Err(HelloError::Malformed("two host names in server_name"));
            }
            let s = std::str::from_utf8(raw)
                .map_err(|_| HelloError::Malformed("server name is not ASCII"))?;
            if s.is_empty() || !s.is_ascii() || s.bytes().any(|b| b.is_ascii_control() || b == b' ')
            {
                return Err(HelloError::Malformed("server name is not a host name"));
            }
            name = Some(s.to_owned());
        }
    }
    Ok(name)
}

fn alpn(data: &[u8]) -> Result<Vec<String>, HelloError> {
    let mut r = Reader(data);
    let len = usize::from(r.u16()?);
    let mut list = Reader(r.take(len)?);
    let mut out = Vec::new();
    while !list.0.is_empty() {
        let l = usize::from(list.u8()?);
        out.push(String::from_utf8_lossy(list.take(l)?).into_owned());
    }
    Ok(out)
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], HelloError> {
        if self.0.len() < n {
            return Err(HelloError::Malformed("a length runs past the end"));
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8, HelloError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, HelloError> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }
    fn u24(&mut self) -> Result<usize, HelloError> {
        let b = self.take(3)?;
        Ok(usize::from(b[0]) << 16 | usize::from(b[1]) << 8 | usize::from(b[2]))
    }
}

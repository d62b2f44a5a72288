//! Request targets, canonicalised the way the upstream reads them, or refused.
//!
//! Policy matches decoded path segments. Anything two servers could read differently is
//! refused rather than guessed: encoded slashes and backslashes, dot segments (plain or
//! percent-encoded, and with `;` parameters: Tomcat, Jetty and Spring drop a segment's `;…`
//! before resolving dots, so `..;`, `..;x=1`, `%2e%2e%3b` are `..` to them), double percent-encoding (`%252f`), empty segments (`//`), NUL and control characters, bad or overlong
//! percent-encoding (overlong UTF-8 is not UTF-8), characters that Unicode compatibility
//! normalisation turns into path syntax (fullwidth `．．／`), fragments, and anything but origin-form
//! (`/path?query`). A trailing slash is kept as a fact ([`Target::trailing_slash`]): `/a/` and
//! `/a` are different paths to policy.

use serde::Serialize;

/// Longest request target policy reads, in bytes.
pub const MAX_TARGET_BYTES: usize = 8192;

/// A canonical origin-form target.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Target {
    /// Percent-decoded path segments; none is empty, `.`, `..` (also before a `;`), or holds
    /// `/`, `\` or a control.
    pub segments: Vec<String>,
    pub trailing_slash: bool,
    /// Decoded query pairs in order (`+` is a space); `None` when there is no `?`.
    pub query: Option<Vec<(String, String)>>,
}

/// Why a target was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, thiserror::Error)]
#[serde(rename_all = "kebab-case")]
pub enum TargetError {
    #[error("request target is not origin-form (it must start with a single '/')")]
    NotOriginForm,
    #[error("request target is longer than 8192 bytes")]
    TooLong,
    #[error("request target carries a fragment ('#')")]
    Fragment,
    #[error("request target holds a character that is not allowed in a URL")]
    InvalidCharacter,
    #[error("malformed percent-encoding in the request target")]
    BadPercentEncoding,
    #[error("request target decodes to invalid UTF-8 (overlong or broken sequences)")]
    NotUtf8,
    #[error("request target has an encoded '/' inside a path segment")]
    EncodedSlash,
    #[error(
        "request target is percent-encoded twice (a server that decodes again would read another path)"
    )]
    DoubleEncoded,
    #[error("request target has a backslash (plain or encoded)")]
    Backslash,
    #[error("request target has a NUL or control character")]
    ControlCharacter,
    #[error("request target has a '.' or '..' segment (plain or encoded)")]
    DotSegment,
    #[error(
        "request target has a '.' or '..' segment with ';' parameters ('..;', plain or encoded), which servers such as Tomcat, Jetty and Spring resolve as '..'"
    )]
    DotSegmentWithParameters,
    #[error("request target has an empty path segment ('//', or ';' parameters on nothing)")]
    EmptySegment,
    #[error(
        "request target has a character that Unicode compatibility normalisation (NFKC) turns into '.', '/', '\\', ';' or '%' (a fullwidth or look-alike form), which servers that normalise before routing read as path syntax"
    )]
    CompatibilityForm,
}

impl Target {
    /// The segments as `&str`s, for slice patterns.
    pub fn parts(&self) -> Vec<&str> {
        self.segments.iter().map(String::as_str).collect()
    }

    /// The single value of query key `key`: `None` if absent or given more than once.
    pub fn query_value(&self, key: &str) -> Option<&str> {
        let pairs = self.query.as_ref()?;
        let mut found = pairs.iter().filter(|(k, _)| k == key);
        let first = found.next()?;
        if found.next().is_some() {
            return None;
        }
        Some(first.1.as_str())
    }

    /// The canonical path, re-encoded minimally (for audit records: no query values).
    pub fn path(&self) -> String {
        let mut p = String::new();
        for s in &self.segments {
            p.push('/');
            p.push_str(&percent_encoding::utf8_percent_encode(s, SEGMENT).to_string());
        }
        if self.segments.is_empty() || self.trailing_slash {
            p.push('/');
        }
        p
    }
}

const SEGMENT: &percent_encoding::AsciiSet = &percent_encoding::CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'%')
    .add(b'/')
    .add(b'?')
    .add(b'\\')
    .add(b'<')
    .add(b'>')
    .add(b'`')
    .add(b'{')
    .add(b'}');

/// Canonicalise a raw request target.
pub fn canonicalize(raw: &str) -> Result<Target, TargetError> {
    if raw.len() > MAX_TARGET_BYTES {
        return Err(TargetError::TooLong);
    }
    if !raw.starts_with('/') || raw.starts_with("//") {
        return Err(TargetError::NotOriginForm);
    }
    if raw.contains('#') {
        return Err(TargetError::Fragment);
    }
    if !raw.bytes().all(is_target_byte) {
        return Err(if raw.bytes().any(|b| b < 0x20 || b == 0x7f) {
            TargetError::ControlCharacter
        } else if raw.contains('\\') {
            TargetError::Backslash
        } else {
            TargetError::InvalidCharacter
        });
    }
    let (path, query) = match raw.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (raw, None),
    };
    let body = &path[1..];
    let trailing_slash = !body.is_empty() && body.ends_with('/');
    let body = body.strip_suffix('/').unwrap_or(body);
    let mut segments = Vec::new();
    if !body.is_empty() {
        for raw_seg in body.split('/') {
            if raw_seg.is_empty() {
                return Err(TargetError::EmptySegment);
            }
            let seg = decode(raw_seg, false)?;
            if has_percent_triplet(&seg) {
                return Err(TargetError::DoubleEncoded);
            }
            if seg.contains('/') {
                return Err(TargetError::EncodedSlash);
            }
            if seg.contains('\\') {
                return Err(TargetError::Backslash);
            }
            if seg == "." || seg == ".." {
                return Err(TargetError::DotSegment);
            }
            if adds_path_syntax(&seg) {
                return Err(TargetError::CompatibilityForm);
            }
            // Servers that take `;` as the start of a segment's parameters (Tomcat, Jetty,
            // Spring) read only the part before it as the segment: `..;x` is `..` and `;x` is
            // empty to them, whether the `;` was sent plain or as `%3B`.
            if let Some((stem, _)) = seg.split_once(';') {
                if stem == "." || stem == ".." {
                    return Err(TargetError::DotSegmentWithParameters);
                }
                if stem.is_empty() {
                    return Err(TargetError::EmptySegment);
                }
            }
            segments.push(seg);
        }
    }
    let query = query
        .map(|q| {
            q.split('&')
                .filter(|p| !p.is_empty())
                .map(|pair| {
                    let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                    Ok((decode(k, true)?, decode(v, true)?))
                })
                .collect::<Result<Vec<_>, TargetError>>()
        })
        .transpose()?;
    Ok(Target {
        segments,
        trailing_slash,
        query,
    })
}

/// Whether Unicode compatibility normalisation (NFKC, which some servers and frameworks apply
/// to paths before routing) would add a character
/// with meaning in a path: `．．` is `..`, `／` is `/`, `％2e` is `%2e` to them. Policy reads
/// the segment as sent, so any such form is refused rather than guessed.
fn adds_path_syntax(seg: &str) -> bool {
    use unicode_normalization::UnicodeNormalization;
    if seg.is_ascii() {
        return false;
    }
    let count = |s: &str, c: char| s.chars().filter(|&x| x == c).count();
    let normal: String = seg.nfkc().collect();
    ['.', '/', '\\', ';', '%']
        .iter()
        .any(|&c| count(&normal, c) > count(seg, c))
}

/// Whether `s` still holds a `%XX` escape after one decoding.
fn has_percent_triplet(s: &str) -> bool {
    s.as_bytes()
        .windows(3)
        .any(|w| w[0] == b'%' && w[1].is_ascii_hexdigit() && w[2].is_ascii_hexdigit())
}

/// Bytes that may appear in an origin-form target as sent on the wire (RFC 3986 pchar, `/`,
/// `?`, `%`; no spaces, quotes, angle brackets, backslashes, controls or non-ASCII).
fn is_target_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@/?%[]".contains(&b)
}

fn decode(s: &str, plus_is_space: bool) -> Result<String, TargetError> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = bytes
                    .get(i + 1..i + 3)
                    .ok_or(TargetError::BadPercentEncoding)?;
                let hi = (hex[0] as char)
                    .to_digit(16)
                    .ok_or(TargetError::BadPercentEncoding)?;
                let lo = (hex[1] as char)
                    .to_digit(16)
                    .ok_or(TargetError::BadPercentEncoding)?;
                out.push((hi * 16 + lo) as u8);
                i += 3;
            }
            b'+' if plus_is_space => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    let decoded = String::from_utf8(out).map_err(|_| TargetError::NotUtf8)?;
    if decoded.chars().any(char::is_control) {
        return Err(TargetError::ControlCharacter);
    }
    Ok(decoded)
}

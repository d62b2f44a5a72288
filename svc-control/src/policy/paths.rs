//! Path patterns of policy-gated hosts (`egress.policy.<host>.paths`), matched against
//! canonical targets: `*` matches within one segment, `**` (a whole segment) matches zero or
//! more segments. Matching is on decoded segments and case-sensitive. A request with a
//! trailing slash matches only a pattern that ends in `/` or `/**`.

use crate::config::egress::PathPattern;

use super::target::Target;

/// Whether `pattern` allows `target`'s path.
pub fn matches(pattern: &PathPattern, target: &Target) -> bool {
    let raw = pattern.as_str();
    let pattern_trailing = raw.len() > 1 && raw.ends_with('/');
    let segs: Vec<&str> = raw
        .trim_start_matches('/')
        .trim_end_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    let ends_with_globstar = segs.last() == Some(&"**");
    if target.trailing_slash && !(pattern_trailing || ends_with_globstar) {
        return false;
    }
    if pattern_trailing && !target.trailing_slash {
        return false;
    }
    match_segments(&segs, &target.parts())
}

fn match_segments(pattern: &[&str], path: &[&str]) -> bool {
    match pattern.split_first() {
        None => path.is_empty(),
        Some((&"**", rest)) => (0..=path.len()).any(|skip| match_segments(rest, &path[skip..])),
        Some((p, rest)) => path
            .split_first()
            .is_some_and(|(s, path_rest)| glob(p, s) && match_segments(rest, path_rest)),
    }
}

/// `*` matches any run of characters within one segment.
fn glob(pattern: &str, s: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == s;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !s.starts_with(first)
        || !s[first.len()..].ends_with(last)
        || s.len() < first.len() + last.len()
    {
        return false;
    }
    let mut rest = &s[first.len()..s.len() - last.len()];
    for mid in &parts[1..parts.len() - 1] {
        match rest.find(mid) {
            Some(i) => rest = &rest[i + mid.len()..],
            None => return false,
        }
    }
    true
}

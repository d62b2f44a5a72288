//! Standard output that ends quietly when the reader goes away (`svc … | head`), instead of
//! panicking on a broken pipe.

use std::io::Write as _;

/// Write one line to standard output; exit 0 if the pipe is closed.
pub fn line(s: &str) {
    let mut out = std::io::stdout().lock();
    if let Err(e) = writeln!(out, "{s}")
        && e.kind() == std::io::ErrorKind::BrokenPipe
    {
        std::process::exit(0);
    }
}

/// `println!` that survives a closed pipe.
#[macro_export]
macro_rules! outln {
    () => { $crate::out::line("") };
    ($($arg:tt)*) => { $crate::out::line(&format!($($arg)*)) };
}

/// `uid 1001 (alice)`, or the uid alone.
pub(crate) fn owner_text(uid: u32, name: Option<&str>) -> String {
    match name {
        Some(n) => format!("{uid} ({n})"),
        None => uid.to_string(),
    }
}

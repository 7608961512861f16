//! Logging from inside an application: `tracing` to stderr, filtered by `PHOS_LOG`
//! (default `warn`), installed only if the process has no subscriber of its own.

use std::sync::Once;

pub fn init() {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        let filter = tracing_subscriber::EnvFilter::try_from_env("PHOS_LOG")
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_target(false)
            .without_time()
            .try_init();
    });
}

/// Log, once per process, that a use of an API is not supported (it answers `answer`).
pub fn not_supported_once(what: &str, answer: &str) {
    static LOGGED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let mut logged = LOGGED.lock().unwrap_or_else(|p| p.into_inner());
    if !logged.iter().any(|w| w == what) {
        logged.push(what.to_string());
        init();
        tracing::warn!("{what} is not supported by Phos; returning {answer}");
    }
}

//! What the audit module saw while `phosctl run`'s program ran (its report file,
//! `PHOS_AUDIT_REPORT`), said when the program has exited: a process that mapped a CUDA
//! runtime or driver that is not Phos's (beside Phos's library, or instead of it), and the
//! NVIDIA libraries Phos does not serve yet that a process loaded.

use std::collections::BTreeMap;

use phos_protocol::text::printable;

/// One event of the report (the format is the audit module's: one tab-separated line each,
/// `PID KIND PROGRAM PATH SONAME LIBRARY`, `-` for an empty field).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub pid: u32,
    pub kind: Kind,
    pub program: String,
    pub path: String,
    pub soname: Option<String>,
    pub library: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Phos's guest library was mapped.
    Phos,
    /// A CUDA runtime or driver that is not Phos's was mapped.
    Bypass,
    /// An NVIDIA library that Phos does not serve yet was mapped.
    Unserved,
}

fn field(s: &str) -> Option<String> {
    (s != "-" && !s.is_empty()).then(|| s.to_string())
}

/// The events of a report; lines that do not parse (a line cut short by a full disk) are
/// left out.
pub fn parse(text: &str) -> Vec<Event> {
    text.lines()
        .filter_map(|line| {
            let mut f = line.split('\t');
            let pid = f.next()?.parse().ok()?;
            let kind = match f.next()? {
                "phos" => Kind::Phos,
                "bypass" => Kind::Bypass,
                "unserved" => Kind::Unserved,
                _ => return None,
            };
            let program = f.next()?.to_string();
            let path = f.next()?.to_string();
            let soname = field(f.next()?);
            let library = field(f.next()?);
            Some(Event { pid, kind, program, path, soname, library })
        })
        .collect()
}

/// What the events mean to the user, one warning per process that bypassed Phos and one
/// note per process that loaded libraries Phos does not serve yet.
pub fn findings(events: &[Event]) -> Vec<String> {
    let mut by_pid: BTreeMap<u32, Vec<&Event>> = BTreeMap::new();
    for e in events {
        by_pid.entry(e.pid).or_default().push(e);
    }
    let mut out = Vec::new();
    for (pid, events) in by_pid {
        let program = events.iter().map(|e| e.program.as_str()).find(|p| *p != "-").unwrap_or("?");
        let who = format!("process {pid} ({})", printable(program));
        let with_phos = events.iter().any(|e| e.kind == Kind::Phos);
        let described = |e: &Event| match &e.soname {
            Some(s) => format!("{} (soname {})", printable(&e.path), printable(s)),
            None => printable(&e.path),
        };
        let bypassed: Vec<String> = events.iter().filter(|e| e.kind == Kind::Bypass).map(|e| described(e)).collect();
        if !bypassed.is_empty() {
            let how = if with_phos {
                "beside Phos's library: its CUDA calls through them reached the GPU directly, bypassing Phos"
            } else {
                "and never loaded Phos's library: it ran on the GPU without Phos"
            };
            out.push(format!(
                "{who} mapped a CUDA runtime or driver that is not Phos's, {}, {how} (no isolation, accounting, \
                 policies or checkpoints). Phos replaces these libraries by name; a copy under another name, or a \
                 CUDA runtime of a version Phos does not present, escapes it (docs/operations.md, \"No bypass\")",
                bypassed.join(", ")
            ));
        }
        let unserved: Vec<String> = events
            .iter()
            .filter(|e| e.kind == Kind::Unserved)
            .map(|e| format!("{} ({})", e.library.as_deref().map_or("?".into(), printable), printable(&e.path)))
            .collect();
        if !unserved.is_empty() {
            out.push(format!(
                "{who} loaded NVIDIA libraries that Phos does not serve yet: {}. They drive the GPU through the CUDA \
                 driver API, which Phos's libcuda.so.1 carries only in part, so their calls may fail",
                unserved.join(", ")
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const REPORT: &str = "\
10\tphos\t/bin/app\t/g/libcudart.so.12\t-\t-
10\tbypass\t/bin/app\t/x/copy.so\tlibcudart.so.12\t-
11\tbypass\t/bin/other\t/usr/lib/libcuda.so.535\t-\t-
10\tunserved\t/bin/app\t/w/libcudnn.so.9\tlibcudnn.so.9\tcuDNN
12\tphos\t/bin/fine\t/g/libcuda.so.1\t-\t-
garbage line
13\tbyp";

    #[test]
    fn the_report_parses_line_by_line() {
        let events = parse(REPORT);
        assert_eq!(events.len(), 5, "the two broken lines are left out: {events:?}");
        assert_eq!(
            events[1],
            Event {
                pid: 10,
                kind: Kind::Bypass,
                program: "/bin/app".into(),
                path: "/x/copy.so".into(),
                soname: Some("libcudart.so.12".into()),
                library: None,
            }
        );
    }

    #[test]
    fn each_process_that_bypassed_phos_is_named_with_how() {
        let said = findings(&parse(REPORT));
        assert_eq!(said.len(), 3, "{said:#?}");
        assert!(
            said[0].starts_with("process 10 (/bin/app) mapped")
                && said[0].contains("/x/copy.so (soname libcudart.so.12)")
        );
        assert!(said[0].contains("beside Phos's library"), "{}", said[0]);
        assert!(said[1].contains("cuDNN (/w/libcudnn.so.9)"), "{}", said[1]);
        assert!(said[2].starts_with("process 11 (/bin/other)") && said[2].contains("never loaded Phos's library"));
        assert!(findings(&parse("12\tphos\t/bin/fine\t/g/libcuda.so.1\t-\t-\n")).is_empty());
    }
}

//! Parses PTX files and prints them back (or their kernel signatures with `--signatures`).

fn main() {
    let mut show_signatures = false;
    for arg in std::env::args().skip(1) {
        if arg == "--signatures" {
            show_signatures = true;
            continue;
        }
        let text = match std::fs::read_to_string(&arg) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("{arg}: {e}");
                std::process::exit(1);
            }
        };
        match phos_ptx::parse(&text) {
            Ok(module) if show_signatures => {
                for sig in phos_ptx::signatures(&module) {
                    print!("{sig}");
                }
            }
            Ok(module) => print!("{module}"),
            Err(e) => {
                eprintln!("{arg}: {e}");
                std::process::exit(1);
            }
        }
    }
}

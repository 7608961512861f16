#!/bin/sh
# The linker of libphos_guest.so, and of nothing else: guestlib/build.rs installs this file as
# $OUT_DIR/gnu-ld/ld.bfd, filling in the @...@ values below, and only the cdylib's link is
# told to use it (`-B<that dir> -fuse-ld=bfd`). build.rs says why; in short:
#
# rustc links a cdylib with an anonymous version script,
#     { global: cudaMalloc; ...; local: *; };
# but programs built by nvcc ask for cudaMalloc@libcudart.so.11.0, @libcudart.so.12 or
# @libcudart.so.13, and GNU ld refuses to mix an anonymous version node with named ones. So
# for this one link the script
#   - names rustc's node $default_version: each export it lists gets that version as its
#     default (sym@@node, what dlsym and new links get), and its `local: *` still keeps
#     every other symbol (Rust's std included) out of the dynamic symbol table;
#   - adds the nodes $other_versions, and a linker script that gives each export the alias
#     sym@<node> for each of them (an alias: the same address, so the same function);
# then runs GNU ld ($real_ld) with the rewritten script in place of rustc's. It is all
# derived from rustc's list of exports; nothing here names a CUDA function.
set -eu

real_ld=@REAL_LD@
default_version='@DEFAULT_VERSION@'
other_versions='@OTHER_VERSIONS@'

die() {
    echo "libphos_guest.so link ($0): $*" >&2
    exit 1
}

found=
for arg do
    shift
    case $arg in
    --version-script=*)
        [ -z "$found" ] || die "more than one --version-script; expected only rustc's"
        found=${arg#--version-script=}
        # rustc's script is a single anonymous node: its first non-blank character is `{`.
        first=$(tr -d ' \t\r\n' <"$found" | cut -c1)
        [ "$first" = "{" ] || die "$found is not an anonymous version script: $(head -n 3 "$found")"
        # rustc writes one export a line between `global:` and `local:`.
        awk -v versions="$other_versions" '
            /^[ \t]*local:/ { exports = 0 }
            exports {
                name = $0
                gsub(/[ \t;]/, "", name)
                if (name == "") next
                # extern "C" names; anything else would need quoting in the alias script.
                if (name !~ /^[A-Za-z_][A-Za-z0-9_]*$/) {
                    print "unexpected line in the version script: " $0 > "/dev/stderr"
                    bad = 1
                    exit 1
                }
                n = split(versions, vs, " ")
                for (i = 1; i <= n; i++) printf "\"%s@%s\" = %s;\n", name, vs[i], name
                count++
            }
            /^[ \t]*global:/ { exports = 1 }
            END {
                if (bad) exit 1
                if (count == 0) { print "no exports in the version script" > "/dev/stderr"; exit 1 }
            }
        ' "$found" >"$found.aliases.ld" || die "cannot read the exports of $found"
        {
            printf '%s ' "$default_version"
            cat "$found"
            for v in $other_versions; do printf '%s { };\n' "$v"; done
        } >"$found.versions"
        # The files lie in rustc's temporary directory, which rustc removes after the link.
        set -- "$@" "--version-script=$found.versions" "$found.aliases.ld"
        continue
        ;;
    esac
    set -- "$@" "$arg"
done
[ -n "$found" ] || die "no --version-script on the command line (rustc passes one for a cdylib)"

exec "$real_ld" "$@"

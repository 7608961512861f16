#!/usr/bin/env bash
# Fairness between two tenants with very different kernels, natively and through Phos with
# and without a fair-share policy, in the same run.
#
# Usage (on the GPU machine, from the repository root):
#   tests/scripts/gpu-fairness.sh BIN_DIR OUT_DIR
# Tenant "short" launches kernels of SHORT_US (default 100) microseconds, tenant "long" of
# LONG_US (default 10000), both with share 1, for SECS (default 30) seconds per
# configuration. CONFIGS (default "native phos fair_share") lists the configurations: native
# (two processes, no Phos), phos (the router, no policy), and POLICY[:k=v,...] (the router
# with that shipped policy and parameters, e.g. fair_share:brake_ns=1ms,hold_div=4). A
# router configuration ending in +equal runs the router with PHOS_CONTENTION=equal (device
# time of overlapping work split equally, without water-filling), e.g. fair_share+equal.
# NVML=1 records the driver's per-process utilisation samples (OUT/nvml-*.txt,
# tests/scripts/nvml-process-util.py) and the tenants' logs.
# SCRAPE=1 also writes the router's books every 200 ms (OUT/books-*.txt) and the tenants'
# logs (OUT/log-*), on one clock, for comparing the books with the truth.
# Suffixes @VAR=VALUE set the environment of the router, its servers and the guests, e.g.
# phos@PHOS_SYNC_SPIN_US=0.
#
# Device time is counted as kernels completed times the calibrated time of one kernel on an
# idle GPU (see tests/bench/tenant_load.cu). Writes OUT_DIR/fairness.md: per configuration
# the unfairness |t1 - t2| / (t1 + t2) per 1 s window (median, p95), the device time used
# per second, and the throughput lost against Phos without a policy.
#
# BACKEND=emu with ITERS_SHORT/ITERS_LONG (iterations, skipping calibration) and
# KERNEL_NS_SHORT/KERNEL_NS_LONG dry-runs the script without a GPU.
set -eu
BIN=$(realpath "$1")
OUT=$(realpath "$2")
SECS=${SECS:-30}
SHORT_US=${SHORT_US:-100}
LONG_US=${LONG_US:-10000}
CONFIGS=${CONFIGS:-"native phos fair_share"}
BACKEND=${BACKEND:-cuda}
ARCH=${ARCH:-sm_90}
WORK=$(mktemp -d)
mkdir -p "$OUT"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT

nvcc -O2 -cudart shared -arch="$ARCH" -o "$WORK/tenant_load" tests/bench/tenant_load.cu

calibrate() { # MICROSECONDS -> "ITERS KERNEL_NS"
  "$WORK/tenant_load" calibrate "$1" | awk '{print $2, $4}'
}
if [ -n "${ITERS_SHORT:-}" ]; then
  read -r IS KS <<< "$ITERS_SHORT ${KERNEL_NS_SHORT:?}"
  read -r IL KL <<< "${ITERS_LONG:?} ${KERNEL_NS_LONG:?}"
else
  read -r IS KS <<< "$(calibrate "$SHORT_US")"
  read -r IL KL <<< "$(calibrate "$LONG_US")"
fi
echo "short: $IS iterations, $KS ns per kernel; long: $IL iterations, $KL ns per kernel"

port=9470
for config in $CONFIGS; do
  echo "== $config"
  safe=$(echo "$config" | tr ':,=' '___') # for file names under OUT
  short=("$WORK/tenant_load" run "$IS" "$SECS" "$WORK/$config.short")
  long=("$WORK/tenant_load" run "$IL" "$SECS" "$WORK/$config.long")
  nvml=
  if [ -n "${NVML:-}" ]; then
    # The driver's own per-process utilisation samples, beside the tenants' logs.
    python3 tests/scripts/nvml-process-util.py "$((SECS + 3))" > "$OUT/nvml-$safe.txt" 2>&1 &
    nvml=$!
  fi
  if [ "$config" = native ]; then
    "${short[@]}" & a=$!
    "${long[@]}" & b=$!
    echo "pids short=$a long=$b" > "$OUT/pids-$safe.txt"
    wait $a $b
    [ -n "$nvml" ] && { wait "$nvml" || true; }
    [ -n "${NVML:-}" ] && cp "$WORK/$config.short" "$OUT/log-$safe.short" && cp "$WORK/$config.long" "$OUT/log-$safe.long"
    continue
  fi
  port=$((port + 1))
  dir="$WORK/router-$port"
  mkdir -p "$dir"
  spec=$config
  router_env=()
  # @VAR=VALUE suffixes: environment for the router (and so its API servers) and the guests.
  while [[ $spec == *@* ]]; do
    router_env+=("${spec##*@}")
    spec=${spec%@*}
  done
  case $spec in
    *+equal) spec=${spec%+equal}; router_env+=(PHOS_CONTENTION=equal) ;;
  esac
  {
    echo "listen = \"$dir/router.sock\""
    echo "metrics = \"127.0.0.1:$port\""
    echo "pool = 2"
    for t in short long; do
      printf '[[tenant]]\nname = "%s"\nsocket = "%s/%s.sock"\nshare = 1\n' "$t" "$dir" "$t"
    done
    if [ "$spec" != phos ]; then
      policy=${spec%%:*}
      echo "[[policy]]"
      echo "builtin = \"$policy\""
      if [ "$policy" != "$spec" ]; then
        echo "set = { $(echo "${spec#*:}" | sed -E 's/([a-z_]+)=([^,]+)/\1 = "\2"/g') }"
      fi
    fi
  } > "$dir/router.toml"
  env ${router_env[@]+"${router_env[@]}"} "$BIN/phosctl" serve --backend "$BACKEND" --config "$dir/router.toml" \
    2> "$OUT/router-$safe.log" &
  router=$!
  for _ in $(seq 100); do [ -S "$dir/long.sock" ] && break; sleep 0.1; done
  sleep 2 # the pooled servers' contexts
  scraper=
  if [ -n "${SCRAPE:-}" ]; then
    # The router's books every 200 ms against the tenants' own logs (same clock), for
    # comparing measured device time with the truth window by window.
    python3 - "$port" > "$OUT/books-$safe.txt" <<'PY' &
import re, sys, time, urllib.request
pat = re.compile(r'phos_tenant_resource\{tenant="(\w+)",resource="device_time",kind="measured"\} (\d+)')
while True:
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics").read().decode()
        books = dict(pat.findall(text))
        print(time.monotonic_ns(), books.get("short", 0), books.get("long", 0), flush=True)
    except Exception:
        pass
    time.sleep(0.2)
PY
    scraper=$!
  fi
  env ${router_env[@]+"${router_env[@]}"} "$BIN/phosctl" run --endpoint "unix:$dir/short.sock" -- "${short[@]}" \
    2> "$OUT/guest-$safe-short.log" & a=$!
  env ${router_env[@]+"${router_env[@]}"} "$BIN/phosctl" run --endpoint "unix:$dir/long.sock" -- "${long[@]}" \
    2> "$OUT/guest-$safe-long.log" & b=$!
  sleep 0.5
  pgrep -a phos-api-server > "$OUT/pids-$safe.txt" || true
  wait $a $b
  [ -n "$nvml" ] && { wait "$nvml" || true; }
  [ -n "$scraper" ] && kill "$scraper"
  [ -n "${SCRAPE:-}${NVML:-}" ] && cp "$WORK/$config.short" "$OUT/log-$safe.short" && cp "$WORK/$config.long" "$OUT/log-$safe.long"
  python3 -c "import urllib.request,sys; sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:$port/metrics').read().decode())" \
    > "$OUT/metrics-$safe.txt" || true
  # A run in which a tenant did not go through this router measures nothing of Phos.
  for t in short long; do
    grep -q "phos_tenant_resource{tenant=\"$t\",resource=\"kernel_launches\"" "$OUT/metrics-$safe.txt" \
      || { echo "$config: tenant $t has no launches at the router; the row is invalid"; touch "$WORK/$config.invalid"; }
  done
  kill $router
  wait $router || true
done

python3 - "$WORK" "$OUT/fairness.md" "$KS" "$KL" "$SECS" $CONFIGS <<'PY'
import bisect, os, statistics, sys
work, out, ks, kl, secs = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
configs = sys.argv[6:]

def curve(path, kernel_ns):
    """Cumulative device time (ns) against time, linear between completed batches."""
    pts = [tuple(map(int, l.split())) for l in open(path)]
    ts = [t for t, _ in pts]
    ws = [n * kernel_ns for _, n in pts]
    def at(t):
        i = bisect.bisect_right(ts, t)
        if i == 0:
            return 0.0
        if i == len(ts):
            return ws[-1]
        t0, t1, w0, w1 = ts[i - 1], ts[i], ws[i - 1], ws[i]
        return w0 + (w1 - w0) * (t - t0) / (t1 - t0)
    return ts[0], ts[-1], at

def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]

rows = {}
for c in configs:
    s0, s1, short = curve(f"{work}/{c}.short", ks)
    l0, l1, long = curve(f"{work}/{c}.long", kl)
    # Whole 1 s windows while both ran, past the first second of each.
    start, end = max(s0, l0) + 1_000_000_000, min(s1, l1)
    unfair, used, shares = [], [], []
    t = start
    while t + 1_000_000_000 <= end:
        a = short(t + 1e9) - short(t)
        b = long(t + 1e9) - long(t)
        unfair.append(abs(a - b) / (a + b) if a + b > 0 else 0.0)
        used.append((a + b) / 1e9)
        shares.append(a / (a + b) if a + b > 0 else 0.0)
        t += 1_000_000_000
    rows[c] = dict(n=len(unfair), med=statistics.median(unfair), p95=pct(unfair, 95),
                   used=statistics.mean(used), short=statistics.mean(shares))
base = rows.get("phos")
lines = [
    f"short kernel {ks / 1e3:.1f} us, long kernel {kl / 1e3:.1f} us (calibrated alone), equal shares, {secs} s per configuration",
    "",
    "| configuration | windows | unfairness median | unfairness p95 | short tenant's share | device time used per s | against native | throughput lost to policing |",
    "|---|---|---|---|---|---|---|---|",
]
for c, r in rows.items():
    lost = f"{(1 - r['used'] / base['used']) * 100:.1f}%" if base and c not in ("phos", "native") else "-"
    native = rows.get("native")
    vs = f"{r['used'] / native['used']:.3f}" if native else "-"
    invalid = os.path.exists(f"{work}/{c}.invalid")
    c = f"{c} (INVALID: a tenant bypassed the router)" if invalid else c
    lines.append(f"| {c} | {r['n']} | {r['med'] * 100:.2f}% | {r['p95'] * 100:.2f}% | {r['short'] * 100:.1f}% | {r['used']:.3f} s | {vs} | {lost} |")
open(out, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY

#!/usr/bin/env bash
# Bounded fuzzing of the untrusted parsers (fuzz/, cargo-fuzz + libFuzzer):
# builds every target once, runs each for a few seconds from its committed
# corpus, and fails if any input crashes a target or breaks an invariant
# (the input is printed, and kept under the work dir).
#
#   scripts/fuzz.sh [--seconds N] [--sanitizer address|none] [TARGET...]
#   (PVISOR_FUZZ_SECONDS, PVISOR_FUZZ_SANITIZER, PVISOR_FUZZ_ARGS: extra libFuzzer flags)
#
# Works on the stable toolchain: libFuzzer's instrumentation flags are
# nightly-only, so the build runs with RUSTC_BOOTSTRAP=1 (the flags are
# stable compiler features behind the nightly gate; nothing else is used).
# cargo-fuzz is installed once from crates.io into $PVISOR_CACHE/cargo-bin,
# keyed by version. New inputs the runs find go to a scratch corpus, never
# into the repository (fuzz/README.md says how to add some).
source "$(dirname "$0")/common.sh"

CARGO_FUZZ_VERSION=0.13.1
SECONDS_PER_TARGET=${PVISOR_FUZZ_SECONDS:-20}
SANITIZER=${PVISOR_FUZZ_SANITIZER:-address}
TARGETS=()
while (($#)); do
    case $1 in
        --seconds) SECONDS_PER_TARGET=$2; shift 2 ;;
        --sanitizer) SANITIZER=$2; shift 2 ;;
        -*) echo "unknown option $1" >&2; exit 2 ;;
        *) TARGETS+=("$1"); shift ;;
    esac
done

FUZZ_DIR=$REPO/fuzz
FUZZ_BIN=$PVISOR_CACHE/cargo-bin/cargo-fuzz-$CARGO_FUZZ_VERSION/bin
FUZZ_TARGET_DIR=${PVISOR_FUZZ_TARGET_DIR:-$CARGO_TARGET_DIR/fuzz}
WORK=${PVISOR_FUZZ_WORK:-$(mktemp -d /tmp/pvisor-fuzz.XXXXXX)}

# libFuzzer is C++: the build needs a C++ compiler.
install_missing g++
if [ ! -x "$FUZZ_BIN/cargo-fuzz" ]; then
    log "installing cargo-fuzz $CARGO_FUZZ_VERSION into $FUZZ_BIN"
    CARGO_TARGET_DIR=$PVISOR_CACHE/cargo-bin/build cargo install --locked --quiet cargo-fuzz \
        --version "$CARGO_FUZZ_VERSION" --root "${FUZZ_BIN%/bin}"
fi
export PATH=$FUZZ_BIN:$PATH RUSTC_BOOTSTRAP=1
# As cargo-fuzz runs them: the sanitizer runtime's ODR check misfires on Rust binaries.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_odr_violation=0}
# Extra libFuzzer flags for every run (e.g. -jobs=2, -seed=N).
read -r -a EXTRA <<<"${PVISOR_FUZZ_ARGS:-}"

cd "$FUZZ_DIR" || exit 1
((${#TARGETS[@]})) || mapfile -t TARGETS < <(cargo fuzz list)
log "fuzz: building ${#TARGETS[@]} targets (sanitizer $SANITIZER, target dir $FUZZ_TARGET_DIR)"
started=$(date +%s)
cargo fuzz build --sanitizer "$SANITIZER" --target-dir "$FUZZ_TARGET_DIR" --codegen-units 16
log "fuzz: build took $(($(date +%s) - started)) s"
BIN_DIR=$FUZZ_TARGET_DIR/$(rustc -vV | sed -n 's/^host: //p')/release

dict_of() {
    case $1 in
        image_*) echo "-dict=$FUZZ_DIR/dict/image.dict" ;;
        egress_policy) echo "-dict=$FUZZ_DIR/dict/policy.dict" ;;
    esac
}

failed=()
summary=()
for t in "${TARGETS[@]}"; do
    mkdir -p "$WORK/corpus/$t" "$WORK/artifacts/$t"
    log "fuzz: $t for ${SECONDS_PER_TARGET} s"
    # New inputs go to the first (scratch) corpus dir; the committed one is only read.
    # shellcheck disable=SC2046 # dict_of gives zero or one word
    if "$BIN_DIR/$t" "$WORK/corpus/$t" "$FUZZ_DIR/corpus/$t" \
        -max_total_time="$SECONDS_PER_TARGET" -timeout=20 -rss_limit_mb=4096 -max_len=65536 \
        -artifact_prefix="$WORK/artifacts/$t/" -print_final_stats=1 $(dict_of "$t") "${EXTRA[@]}" \
        >"$WORK/$t.log" 2>&1; then
        stats=$(grep -E '^stat::(number_of_executed_units|average_exec_per_sec|new_units_added|peak_rss_mb):' "$WORK/$t.log" |
            sed 's/^stat:://; s/: */=/' | tr '\n' ' ')
        cov=$(grep -oE 'cov: [0-9]+ ft: [0-9]+' "$WORK/$t.log" | tail -n 1)
        summary+=("$t: $cov $stats")
    else
        failed+=("$t")
        echo "---- $t FAILED; the end of its log ($WORK/$t.log):" >&2
        tail -n 60 "$WORK/$t.log" >&2
        for a in "$WORK/artifacts/$t"/*; do
            [ -f "$a" ] || continue
            echo "---- failing input $a ($(stat -c %s "$a") bytes), base64:" >&2
            head -c 65536 "$a" | base64 -w 120 >&2
        done
    fi
done
log "fuzz: summary (total $(($(date +%s) - started)) s including the build)"
((${#summary[@]} == 0)) || printf '  %s\n' "${summary[@]}" >&2
if ((${#failed[@]})); then
    echo "fuzz: ${#failed[@]} target(s) failed: ${failed[*]} (inputs under $WORK/artifacts)" >&2
    exit 1
fi
rm -rf "$WORK"

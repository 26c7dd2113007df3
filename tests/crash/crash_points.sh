#!/usr/bin/env bash
# Crash points: kill the process (SIGKILL through strace's fault injection) at each file-system system
# call of an export (`nibble quantize` on stories260K, into a new folder and over an older export) or of
# one QAD checkpoint save (test_qad --crash-run on its tiny model), then check that the output is absent
# or complete and byte-identical (old or new), that nothing left beside it can be taken for a model or a
# checkpoint, and that running again gives the bytes of a run never killed. The export mode also checks
# durability (every file fsynced, the parent folder fsynced after the final rename) and a file-size
# limit (`ulimit -f`: a named error, exit 1, nothing left; not death by SIGXFSZ).
#   crash_points.sh export NIBBLE_BIN SHARED_DATA
#   crash_points.sh qad TEST_QAD_BIN
# Exit 0 when every point holds, 1 otherwise, 77 (skipped) without strace, ptrace or the shared data.
set -u
mode=$1
bin=$2
command -v strace >/dev/null || { echo "SKIP: strace is not installed (scripts/install-deps.sh)"; exit 77; }
strace -qq -o /dev/null true 2>/dev/null || { echo "SKIP: strace cannot trace here (ptrace not permitted)"; exit 77; }
# LeakSanitizer cannot run under ptrace (sanitizer builds); leaks are the other tests' business
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
W=$(mktemp -d "${TMPDIR:-/tmp}/nibble-crash-XXXXXX")
[ -n "${KEEP:-}" ] || trap 'rm -rf "$W"' EXIT
fail=0
points=0
bad() { echo "FAIL: $*"; fail=1; }

# The file-system calls nibble's writers make (open/create, data, durability, names, locks).
SYSCALLS="openat write pwrite64 fsync rename renameat2 mkdir unlink unlinkat rmdir ftruncate flock"
TRACE=$(echo $SYSCALLS | tr ' ' ',')

# count LOG START_RE END_RE: "syscall first last" per syscall with calls between the first line matching
# START_RE (inclusive) and the first matching END_RE (exclusive; "" = the end), counted for the traced
# process's main thread, which is what when=N counts (strace counts per thread).
count() {
    awk -v start="$2" -v end="$3" -v list="$SYSCALLS" '
        BEGIN { n = split(list, s, " "); for (i = 1; i <= n; i++) want[s[i]] = 1 }
        NR == 1 { pid = $1 }
        $1 != pid { next }
        {
            name = $2; sub(/\(.*/, "", name)
            if (!(name in want)) next
            if (phase == 0 && $0 ~ start) phase = 1
            if (phase == 1 && end != "" && $0 ~ end) phase = 2
            c[name]++
            if (phase == 0) before[name] = c[name]
            if (phase == 1) last[name] = c[name]
        }
        END { for (k in last) print k, before[k] + 1, last[k] }' "$1"
}

# kill_points FIRST LAST SYSCALL: the calls to kill at. All of them, but for write, whose calls inside one
# file are the same crash point over and over: the first three, the last three and every tenth.
kill_points() {
    local first=$1 last=$2 sc=$3 n
    for ((n = first; n <= last; n++)); do
        if [ "$sc" != write ] || [ $((n - first)) -lt 3 ] || [ $((last - n)) -lt 3 ] || [ $(((n - first) % 10)) -eq 0 ]; then
            echo "$n"
        fi
    done
}

# Run "$@" under strace, killed at the N-th call of SYSCALL; 137 when the kill happened.
killed_at() {
    local sc=$1 n=$2
    shift 2
    # in a subshell whose stderr is dropped: the shell's own "Killed" report goes there
    (strace -f -qq -o /dev/null -e trace="$sc" -e inject="$sc":signal=KILL:when="$n" "$@" >/dev/null 2>&1; exit $?) 2>/dev/null
}

# ---- export ------------------------------------------------------------------------------------------
if [ "$mode" = export ]; then
    M=$3/stories260K/hf
    [ -f "$M/model.safetensors" ] || { echo "SKIP: shared data file $M/model.safetensors is absent"; exit 77; }
    quantize() { "$bin" quantize --model "$M" --format "$1" --out "$2" --quiet; }
    quantize nvfp4_w4a16 "$W/new" >/dev/null || { bad "the reference export failed"; exit 1; }
    quantize mxfp8 "$W/old" >/dev/null || { bad "the older export failed"; exit 1; }

    # leftovers T: what may be beside T/out after a kill: its lock file, and staging folders that hold
    # no model (nothing but the INCOMPLETE note, export/ and old/ at their top)
    leftovers_ok() {
        local e
        for e in "$1"/* "$1"/.[!.]*; do
            [ -e "$e" ] || continue
            case "${e##*/}" in
                out) ;;
                out.nibble-lock) [ -f "$e" ] || { echo "$e is not a file"; return 1; } ;;
                out.nibble-tmp-*)
                    local f
                    for f in "$e"/* "$e"/.[!.]*; do
                        [ -e "$f" ] || continue
                        case "${f##*/}" in INCOMPLETE|export|old) ;; *) echo "staging $e holds ${f##*/}"; return 1 ;; esac
                    done
                    [ -z "$(ls -A "$e")" ] || [ -f "$e/INCOMPLETE" ] || { echo "staging $e has no INCOMPLETE note"; return 1; } ;;
                *) echo "unexpected $e"; return 1 ;;
            esac
        done
    }

    for scenario in fresh replace; do
        mkdir -p "$W/count"
        rm -rf "$W/count/out"
        [ $scenario = replace ] && cp -a "$W/old" "$W/count/out"
        strace -f -qq -o "$W/log" -e trace="$TRACE" "$bin" quantize --model "$M" --format nvfp4_w4a16 \
            --out "$W/count/out" --quiet >/dev/null 2>&1 || { bad "$scenario: the traced export failed"; continue; }
        # from the export's first write (its lock file; the staging folder where there is no lock) to the end
        count "$W/log" 'out\.nibble-lock", O_RDWR\|O_CREAT|mkdir\(".*/out\.nibble-tmp-' "" >"$W/points"
        [ -s "$W/points" ] || { bad "$scenario: no export seen in the trace"; continue; }
        while read -r sc first last; do
            for n in $(kill_points "$first" "$last" "$sc"); do
                T=$W/t
                rm -rf "$T"
                mkdir -p "$T"
                [ $scenario = replace ] && cp -a "$W/old" "$T/out"
                killed_at "$sc" "$n" "$bin" quantize --model "$M" --format nvfp4_w4a16 --out "$T/out" --quiet
                rc=$?
                points=$((points + 1))
                where="$scenario, SIGKILL at $sc #$n"
                [ $rc -eq 137 ] || { bad "$where: not killed (exit $rc)"; continue; }
                if [ -e "$T/out" ]; then
                    if ! diff -r "$T/out" "$W/new" >/dev/null; then
                        [ $scenario = replace ] && diff -r "$T/out" "$W/old" >/dev/null || bad "$where: out is neither the old nor the new export"
                    fi
                elif [ $scenario = replace ]; then
                    bad "$where: the older export is gone"
                fi
                why=$(leftovers_ok "$T") || bad "$where: $why"
                quantize nvfp4_w4a16 "$T/out" >/dev/null 2>&1 || { bad "$where: the export after the kill failed"; continue; }
                diff -r "$T/out" "$W/new" >/dev/null || bad "$where: the export after the kill differs from the reference"
                [ "$(ls -A "$T")" = out ] || bad "$where: left beside out after the next export: $(ls -A "$T" | tr '\n' ' ')"
            done
        done <"$W/points"
        echo "export ($scenario): $(awk '{printf "%s%s %d-%d", sep, $1, $2, $3; sep=", "}' "$W/points")"
    done

    # durability: every file fsynced under its staging name, then the rename, then the parent fsynced
    rm -rf "$W/d"
    mkdir -p "$W/d"
    strace -f -qq -y -o "$W/dlog" -e trace=fsync,rename,renameat2 "$bin" quantize --model "$M" --format nvfp4_w4a16 \
        --out "$W/d/out" --quiet >/dev/null 2>&1 || bad "durability: the traced export failed"
    for f in "$W/new"/*; do
        grep -Eq "fsync\([0-9]+<.*/out\.nibble-tmp-[0-9]+/(export/)?${f##*/}>\)" "$W/dlog" ||
            bad "durability: ${f##*/} is never fsynced"
    done
    awk -v d="$W/d" '/rename.*", "[^"]*\/d\/out"/ { r = 1; next } r && index($0, "fsync(") && index($0, "<" d ">") { ok = 1 }
                     END { exit !ok }' "$W/dlog" || bad "durability: the parent folder is not fsynced after the final rename"

    # a file-size limit smaller than model.safetensors (462,048 bytes): one line, exit 1, nothing left
    mkdir -p "$W/x"
    (ulimit -f 200; exec "$bin" quantize --model "$M" --format nvfp4_w4a16 --out "$W/x/out" --quiet) >"$W/xout" 2>"$W/xerr"
    rc=$?
    [ $rc -eq 1 ] || bad "ulimit -f 200: exit $rc (153 is death by SIGXFSZ)"
    grep -Eqx "nibble quantize: NB_ERR_IO: cannot write $W/x/out\.nibble-tmp-[0-9]+/export/model\.safetensors: File too large" "$W/xerr" ||
        bad "ulimit -f 200: stderr is: $(cat "$W/xerr")"
    [ -z "$(ls -A "$W/x")" ] || bad "ulimit -f 200 left $(ls -A "$W/x" | tr '\n' ' ')"
fi

# ---- QAD checkpoint save --------------------------------------------------------------------------------
if [ "$mode" = qad ]; then
    run() { "$bin" --crash-run "$1" "$2"; }
    run "$W/ref_ck" "$W/ref_out" >/dev/null || { bad "the reference run failed"; exit 1; }
    strace -f -qq -o "$W/log" -e trace="$TRACE" "$bin" --crash-run "$W/c_ck" "$W/c_out" >/dev/null 2>&1 ||
        { bad "the traced run failed"; exit 1; }
    # the save of step 2: from its staging folder's mkdir to the next step's
    count "$W/log" 'mkdir\(".*/\.step-00000002\.tmp-' 'mkdir\(".*/\.step-00000003\.tmp-' >"$W/points"
    [ -s "$W/points" ] || { bad "no save of step 2 seen in the trace"; exit 1; }
    while read -r sc first last; do
        for n in $(kill_points "$first" "$last" "$sc"); do
            rm -rf "$W/ck" "$W/out" "$W/out.student.safetensors"
            killed_at "$sc" "$n" "$bin" --crash-run "$W/ck" "$W/out"
            rc=$?
            points=$((points + 1))
            where="SIGKILL at $sc #$n"
            [ $rc -eq 137 ] || { bad "$where: not killed (exit $rc)"; continue; }
            # every step folder is complete (manifest written last); `latest` names one of them
            for d in "$W/ck"/step-*; do
                [ -e "$d" ] || continue
                for f in manifest.json student.safetensors trainer.safetensors; do
                    [ -f "$d/$f" ] || bad "$where: ${d##*/} has no $f"
                done
            done
            if [ -f "$W/ck/latest" ]; then
                [ -f "$W/ck/$(cat "$W/ck/latest")/manifest.json" ] || bad "$where: latest names $(cat "$W/ck/latest")"
            fi
            # the resume must start from the newest complete step folder, whatever `latest` says
            want=0
            for d in "$W/ck"/step-*/manifest.json; do
                [ -e "$d" ] || continue
                d=${d%/manifest.json}
                n=$((10#${d##*/step-}))
                [ $n -gt $want ] && want=$n
            done
            from=$(run "$W/ck" "$W/out" 2>/dev/null | sed -n 's/^resumed from step //p')
            [ -n "$from" ] || { bad "$where: the resumed run failed"; continue; }
            [ "$from" = "$want" ] || bad "$where: resumed from step $from, but step-$want is complete"
            # a finished save of step 2 (renamed, latest perhaps not yet) is where the resume starts
            [ -f "$W/log.resumed" ] || : >"$W/log.resumed"
            echo "$from" >>"$W/log.resumed"
            for f in out/model.safetensors out/config.json out.student.safetensors; do
                cmp -s "$W/$f" "$W/ref_$f" || bad "$where: resumed $f differs from the uninterrupted run's"
            done
            for f in manifest.json student.safetensors trainer.safetensors; do
                cmp -s "$W/ck/step-00000012/$f" "$W/ref_ck/step-00000012/$f" || bad "$where: the last checkpoint's $f differs"
            done
            [ "$(ls -A "$W/ck" | tr '\n' ' ')" = "latest step-00000011 step-00000012 " ] ||
                bad "$where: the checkpoint folder holds $(ls -A "$W/ck" | tr '\n' ' ')"
        done
    done <"$W/points"
    echo "qad save of step 2: $(awk '{printf "%s%s %d-%d", sep, $1, $2, $3; sep=", "}' "$W/points")"
    echo "resumed from step: $(sort -n "$W/log.resumed" | uniq -c | awk '{printf "%s%s x%d", sep, $2, $1; sep=", "}')"
fi

echo "$points crash points, $([ $fail -eq 0 ] && echo "all hold" || echo "FAILED")"
exit $fail

# verl-hyperlight's guest runner for the bash image: what `guest/runner.py` is for Python.
#
# hluk's bash image is BusyBox's hush (NOMMU), one persistent shell that sources each call's code
# (hyperlight-unikraft's drivers/bash/hl_bashdriver.c): this runner, sourced once as the warm-exec,
# gives the solution what Sandbox Fusion's `/bin/bash FILE.sh` gives it (a script of its own in a
# working directory holding the request's files, stdin from the case's input, stdout and stderr
# apart, its exit status) as a child `sh`, so that its `exit`, `set -e`, `cd` and variables stay
# its own; then reports the case on the console in the frames of `guest/protocol.py`. The host
# defines VH_* (protocol.py's constants) before it (guests.py).
#
# What the image's shell cannot do shapes every line: an external command whose own process must
# move descriptors before it execs (a pipe, `cmd >file`, `cmd <file`, `2>&1`, `$( )`, a
# here-document to a command, `&`) crashes the micro-VM, so every external command here is plain,
# its redirects set on a `{ }` group, which hush sets in its own process; values come back through
# files and the `read` builtin. Descriptors 3-9 are never redirected with `exec`: the driver's
# pipes are 4 and 7. Functions and variables are prefixed vh_, out of a solution's way.

# A frame on the console (the shell's stdout): the printf builtin, no process.
vh_frame() {
    printf '\n%s\n' "$*"
}

# Refuse the case, with why.
vh_refuse() {
    printf '%s' "$1" >"$vh_o/refusal"
    { base64 -w 0 "$vh_o/refusal"; } >"$vh_o/refusal.b64"
    IFS= read -r vh_b64 <"$vh_o/refusal.b64"
    vh_frame "$vh_n $VH_REFUSED $vh_b64"
}

# The request's manifest (protocol.FILES, JSON) as lines: `w INDEX PATH`, `f PATH`, or `! WHY`.
VH_MANIFEST_AWK='
function hexval(h,    i, v) {
    v = 0
    for (i = 1; i <= 4; i++) v = v * 16 + index("0123456789abcdef", tolower(substr(h, i, 1))) - 1
    return v
}
function utf8(c) {
    if (c < 128) return sprintf("%c", c)
    if (c < 2048) return sprintf("%c%c", 192 + int(c / 64), 128 + c % 64)
    if (c < 65536) return sprintf("%c%c%c", 224 + int(c / 4096), 128 + int(c / 64) % 64, 128 + c % 64)
    return sprintf("%c%c%c%c", 240 + int(c / 262144), 128 + int(c / 4096) % 64, 128 + int(c / 64) % 64, 128 + c % 64)
}
function skip() { while (index(" \t\r\n,:", substr(s, p, 1)) && p <= length(s)) p++ }
function str(    out, c, e, cp, lo) {
    skip(); p++; out = ""
    while (p <= length(s)) {
        c = substr(s, p, 1); p++
        if (c == "\"") return out
        if (c != "\\") { out = out c; continue }
        e = substr(s, p, 1); p++
        if (e == "n") out = out "\n"
        else if (e == "t") out = out "\t"
        else if (e == "r") out = out "\r"
        else if (e == "b") out = out "\b"
        else if (e == "f") out = out "\f"
        else if (e == "u") {
            cp = hexval(substr(s, p, 4)); p += 4
            if (cp >= 55296 && cp < 56320 && substr(s, p, 2) == "\\u") {
                lo = hexval(substr(s, p + 2, 4)); p += 6
                cp = 65536 + (cp - 55296) * 1024 + (lo - 56320)
            }
            out = out utf8(cp)
        } else out = out e
    }
    return out
}
function num(    start) {
    skip(); start = p
    while (index("0123456789", substr(s, p, 1)) && p <= length(s)) p++
    return substr(s, start, p - start)
}
function name(path) {
    if (index(path, "\n")) { print "! a request file name holds a line break, which the bash image cannot take"; bad = 1 }
    return path
}
{ s = s $0 "\n" }
END {
    p = 1; skip(); p++  # {
    while (!bad) {
        skip()
        if (substr(s, p, 1) == "}" || p > length(s)) break
        key = str(); skip(); p++  # [
        while (!bad) {
            skip()
            if (substr(s, p, 1) == "]") { p++; break }
            if (key == "write") {
                p++  # [
                path = name(str()); index_ = num(); skip(); p++  # ]
                if (!bad) print "w " index_ " " path
            } else {
                path = name(str())
                if (!bad) print "f " path
            }
        }
    }
}'

# The report's frames, from the base64 files given (stdout.b64, stderr.b64, file.N.b64, each line
# 32766 bytes of output): the end, a frame per line, done; in one file for one console write.
VH_REPORT_AWK='
BEGIN { printf "\n%s %s %s\n", nonce, end_frame, fields }
{
    kind = FILENAME; sub(/.*\//, "", kind); sub(/\.b64$/, "", kind); sub(/^file\./, file_frame " ", kind)
    printf "\n%s %s %s\n", nonce, kind, $0
}
END { printf "\n%s %s\n", nonce, done_frame }'

# Run the case mounted at $1 and report it under the nonce $2.
vh_case() {
    vh_c=$1 vh_n=$2 vh_w=/tmp/solution vh_o=/tmp/.verl-hyperlight
    mkdir -p "$vh_w" "$vh_o" || return 1
    cd "$vh_w" || return 1
    : >"$vh_o/fetch"
    if [ -f "$vh_c/$VH_FILES" ]; then
        { awk "$VH_MANIFEST_AWK" "$vh_c/$VH_FILES"; } >"$vh_o/manifest"
        while IFS= read -r vh_l; do
            case $vh_l in
            "w "*)
                vh_i=${vh_l#w } vh_p=${vh_l#w * }
                vh_i=${vh_i%% *}
                case $vh_p in */*) mkdir -p "${vh_p%/*}" ;; esac
                if ! cp "$vh_c/$VH_FILE_PREFIX$vh_i" "$vh_p"; then
                    vh_refuse "cannot write the request's file \"$vh_p\""
                    return 0
                fi
                ;;
            "f "*) printf '%s\n' "${vh_l#f }" >>"$vh_o/fetch" ;;
            "! "*)
                vh_refuse "${vh_l#! }"
                return 0
                ;;
            esac
        done <"$vh_o/manifest"
    fi
    # After the request's files: one of them named as the solution does not replace it.
    cp "$vh_c/$VH_SOLUTION" "$vh_w/solution.sh" || return 1
    vh_frame "$vh_n $VH_START"
    { time -o "$vh_o/time" -f %e sh solution.sh; } <"$vh_c/$VH_STDIN" >"$vh_o/stdout" 2>"$vh_o/stderr"
    vh_st=$? vh_el=0
    # time's file: its note of a status that is not 0 (or of a signal), then the wall seconds.
    while IFS= read -r vh_l; do
        case $vh_l in
        "Command terminated by signal "*) vh_st=$((128 + ${vh_l##* })) ;;
        "Command exited with non-zero status "*) vh_st=${vh_l##* } ;;
        *) vh_el=$vh_l ;;
        esac
    done <"$vh_o/time"
    vh_report
    return 0
}

# The output and the fetched files, copied out after the solution's end.
vh_report() {
    { stat -c %s "$vh_o/stdout" "$vh_o/stderr"; } >"$vh_o/sizes"
    { IFS= read -r vh_so; IFS= read -r vh_se; } <"$vh_o/sizes"
    vh_lim=-
    # The output limit, applied once the solution has ended: the shell cannot watch a size.
    if [ "$vh_so" -gt "$VH_OUTPUT_LIMIT" ]; then
        vh_lim=stdout vh_st=$VH_OUTPUT_LIMIT_STATUS vh_so=$VH_OUTPUT_LIMIT
        truncate -s "$VH_OUTPUT_LIMIT" "$vh_o/stdout"
    fi
    if [ "$vh_se" -gt "$VH_OUTPUT_LIMIT" ]; then
        [ "$vh_lim" = - ] && vh_lim=stderr
        vh_st=$VH_OUTPUT_LIMIT_STATUS vh_se=$VH_OUTPUT_LIMIT
        truncate -s "$VH_OUTPUT_LIMIT" "$vh_o/stderr"
    fi
    : >"$vh_o/stdout.b64"
    : >"$vh_o/stderr.b64"
    [ "$vh_so" -gt 0 ] && { base64 -w 43688 "$vh_o/stdout"; } >"$vh_o/stdout.b64"
    [ "$vh_se" -gt 0 ] && { base64 -w 43688 "$vh_o/stderr"; } >"$vh_o/stderr.b64"
    set -- "$vh_o/stdout.b64" "$vh_o/stderr.b64"
    vh_sizes= vh_i=0 vh_total=0
    while IFS= read -r vh_p; do
        vh_size=$VH_FILE_MISSING
        if [ -f "$vh_p" ]; then
            { stat -c %s "$vh_p"; } >"$vh_o/size"
            IFS= read -r vh_size <"$vh_o/size"
            if [ $((vh_total + vh_size)) -gt "$VH_FILES_OUT_LIMIT" ]; then
                vh_total=$((VH_FILES_OUT_LIMIT + 1)) vh_size=$VH_FILE_LEFT_OUT
            else
                vh_total=$((vh_total + vh_size))
                : >"$vh_o/file.$vh_i.b64"
                [ "$vh_size" -gt 0 ] && { base64 -w 43688 "$vh_p"; } >"$vh_o/file.$vh_i.b64"
                set -- "$@" "$vh_o/file.$vh_i.b64"
            fi
        fi
        vh_sizes=$vh_sizes${vh_sizes:+,}$vh_size vh_i=$((vh_i + 1))
    done <"$vh_o/fetch"
    {
        awk -v nonce="$vh_n" -v end_frame="$VH_END" -v done_frame="$VH_DONE" \
            -v file_frame="$VH_FILE" \
            -v fields="$vh_st $vh_el $vh_lim $vh_so $vh_se ${vh_sizes:--}" "$VH_REPORT_AWK" "$@"
    } >"$vh_o/report"
    # One console write per host call's worth (protocol.CONSOLE_WRITE).
    dd if="$vh_o/report" bs="$VH_CONSOLE_WRITE" status=none
}

# A ready guest's workload: wait for the host's GO line on the console's input, then run the case
# as vh_case does; input that ends before it ends the call with no report.
vh_await_case() {
    IFS= read -r vh_line || return 0
    [ "$vh_line" = "$VH_GO" ] || return 0
    vh_case "$@"
}

# The warm-up's workload: report an empty case.
vh_probe() {
    vh_frame "$1 $VH_START"
    vh_frame "$1 $VH_END 0 0.000000 - 0 0 -"
    vh_frame "$1 $VH_DONE"
}

#!/usr/bin/env bash
# Build bai kernel images without a container registry.
#
#   packaging/build-kernel-image.sh [--force] python  [IMAGE_NAME]   # default bai-python:3.11
#   packaging/build-kernel-image.sh [--force] busybox [IMAGE_NAME]   # default bai-busybox:latest
#
# "python" copies the host's CPython 3.11 (binary, stdlib, lib-dynload and every
# shared library they need) plus a static busybox into a rootfs, at the same
# absolute paths as on the host, and `docker import`s it.  "busybox" imports a
# rootfs containing only a static busybox.
#
# Without --force an image that already exists is left alone.
set -euo pipefail
umask 022

usage() {
    echo "usage: $0 [--force] {python|busybox} [IMAGE_NAME]" >&2
    exit 2
}

FORCE=0
KIND=""
NAME=""
for arg in "$@"; do
    case "$arg" in
        --force|-f) FORCE=1 ;;
        -h|--help) usage ;;
        -*) echo "unknown option: $arg" >&2; usage ;;
        *)
            if [ -z "$KIND" ]; then KIND="$arg"
            elif [ -z "$NAME" ]; then NAME="$arg"
            else usage
            fi
            ;;
    esac
done

case "$KIND" in
    python) NAME="${NAME:-bai-python:3.11}" ;;
    busybox) NAME="${NAME:-bai-busybox:latest}" ;;
    *) usage ;;
esac

log() { echo "[build-kernel-image] $*"; }
die() { echo "[build-kernel-image] ERROR: $*" >&2; exit 1; }

command -v docker >/dev/null 2>&1 || die "docker CLI not found (run packaging/start-dockerd.sh first)"
docker info >/dev/null 2>&1 || die "docker daemon not reachable (run packaging/start-dockerd.sh first)"

if [ "$FORCE" -eq 0 ] && docker image inspect "$NAME" >/dev/null 2>&1; then
    echo "$NAME already present"
    exit 0
fi

START_NS=$(date +%s%N)
TMP=$(mktemp -d /tmp/bai-kernel-image.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
ROOT="$TMP/rootfs"
mkdir -p "$ROOT"

# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------

# True if $1 is a statically linked executable.  (`ldd` exits non-zero with
# "not a dynamic executable" for static binaries.)
is_static() {
    local out
    out=$(LC_ALL=C ldd "$1" 2>&1) && return 1
    case "$out" in
        *"not a dynamic executable"*|*"statically linked"*) return 0 ;;
    esac
    return 1
}

# Path to a static busybox on the host; installs busybox-static if needed.
find_static_busybox() {
    local bb
    for bb in /bin/busybox /usr/bin/busybox; do
        if [ -x "$bb" ] && is_static "$bb"; then
            echo "$bb"
            return 0
        fi
    done
    log "static busybox not found; installing busybox-static" >&2
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y -q busybox-static >&2; then
        apt-get update -q >&2
        apt-get install -y -q busybox-static >&2
    fi
    for bb in /bin/busybox /usr/bin/busybox; do
        if [ -x "$bb" ] && is_static "$bb"; then
            echo "$bb"
            return 0
        fi
    done
    return 1
}

# Copy a host file (dereferencing symlinks) to the same path inside $ROOT.
copy_same_path() {
    local src="$1"
    [ -e "$ROOT$src" ] && return 0
    mkdir -p "$ROOT$(dirname "$src")"
    cp -L "$src" "$ROOT$src"
}

# Symlink $ROOT/$dir/$name -> $target unless something is already there.
link_if_absent() {
    local target="$1" path="$2"
    if [ -e "$ROOT$path" ] || [ -L "$ROOT$path" ]; then
        return 0
    fi
    mkdir -p "$ROOT$(dirname "$path")"
    ln -s "$target" "$ROOT$path"
}

install_busybox() {
    local bb applet n=0
    bb=$(find_static_busybox) || die "could not find or install a static busybox"
    mkdir -p "$ROOT/bin"
    cp -L "$bb" "$ROOT/bin/busybox"
    chmod 0755 "$ROOT/bin/busybox"
    link_if_absent busybox /bin/sh
    # `busybox --list` prints applet names, one per line.
    while IFS= read -r applet; do
        [ -n "$applet" ] || continue
        [ "$applet" = busybox ] && continue
        link_if_absent busybox "/bin/$applet"
        n=$((n + 1))
    done < <("$bb" --list)
    # Many scripts use "#!/usr/bin/env ..."
    link_if_absent /bin/busybox /usr/bin/env
    log "busybox from $bb with $n applets"
}

make_base_dirs() {
    mkdir -p "$ROOT/tmp" "$ROOT/home/work"
    chmod 1777 "$ROOT/tmp"
    chmod 0755 "$ROOT/home" "$ROOT/home/work"
}

import_rootfs() {
    # usage: import_rootfs --change ... (the image name is $NAME)
    tar --numeric-owner -C "$ROOT" -cf - . | docker import "$@" - "$NAME" >/dev/null
}

report() {
    local size end_ns
    size=$(docker image inspect -f '{{.Size}}' "$NAME")
    end_ns=$(date +%s%N)
    log "built $NAME: size $(awk -v b="$size" 'BEGIN { printf "%.1f", b / 1048576 }') MiB ($size bytes), took $(awk -v ns="$((end_ns - START_NS))" 'BEGIN { printf "%.2f", ns / 1e9 }') s"
}

# ---------------------------------------------------------------------------
# busybox image
# ---------------------------------------------------------------------------
build_busybox() {
    install_busybox
    make_base_dirs
    import_rootfs --change 'ENV PATH=/bin' --change 'WORKDIR /home/work'
    local out
    out=$(docker run --rm --network none "$NAME" echo hi) || die "verification run of $NAME failed"
    [ "$out" = hi ] || die "verification of $NAME: expected 'hi', got '$out'"
    log "verify: echo hi -> $out"
    report
}

# ---------------------------------------------------------------------------
# python image
# ---------------------------------------------------------------------------
build_python() {
    local py info pybin stdlib platstdlib dynload version
    py=$(command -v python3 || true)
    [ -n "$py" ] || die "python3 not found on the host"
    info=$("$py" - <<'EOF'
import os, sys, sysconfig
# Base-interpreter paths even when python3 is a venv's python.
paths = sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_exec_prefix,
                                  "installed_base": sys.base_prefix,
                                  "installed_platbase": sys.base_exec_prefix})
# In a venv sys.executable is a symlink to the base interpreter; realpath() resolves it.
exe = os.path.realpath(sys.executable)
base = getattr(sys, "_base_executable", None)
if base and os.path.exists(base):
    exe = os.path.realpath(base)
stdlib = os.path.realpath(paths["stdlib"])
platstdlib = os.path.realpath(paths["platstdlib"])
dynload = os.path.join(platstdlib, "lib-dynload")
if not os.path.isdir(dynload):
    dynload = os.path.realpath(sysconfig.get_config_var("DESTSHARED") or dynload)
print(exe)
print(stdlib)
print(platstdlib)
print(dynload)
print("%d.%d" % sys.version_info[:2])
EOF
    )
    { read -r pybin; read -r stdlib; read -r platstdlib; read -r dynload; read -r version; } <<<"$info"
    [ "$version" = "3.11" ] || log "WARNING: host python3 is $version, not 3.11"
    [ -x "$pybin" ] || die "interpreter binary $pybin not found"
    log "interpreter: $pybin"
    log "stdlib: $stdlib  platstdlib: $platstdlib  lib-dynload: $dynload"

    # 1. interpreter binary at the same path
    copy_same_path "$pybin"
    chmod 0755 "$ROOT$pybin"

    # 2. stdlib (+ platstdlib, lib-dynload) at the same paths, trimmed
    local d dirs=()
    for d in "$stdlib" "$platstdlib" "$dynload"; do
        [ -d "$d" ] || continue
        case " ${dirs[*]:-} " in *" $d "*) continue ;; esac
        # skip a dir already covered by one of its parents
        local covered=0 p
        for p in "${dirs[@]:-}"; do
            [ -n "$p" ] && case "$d/" in "$p"/*) covered=1 ;; esac
        done
        [ "$covered" -eq 1 ] || dirs+=("$d")
    done
    for d in "${dirs[@]}"; do
        mkdir -p "$ROOT$d"
        tar -C "$d" -cf - \
            --exclude='./site-packages/*' --exclude='./dist-packages/*' \
            --exclude='__pycache__' --exclude='*.pyc' \
            --exclude='./test' --exclude='test' --exclude='tests' --exclude='idle_test' \
            --exclude='./idlelib' --exclude='./tkinter' --exclude='./turtledemo' \
            --exclude='./ensurepip' --exclude='./lib2to3' \
            --exclude='./config-*/*.a' \
            --exclude='_tkinter*.so' --exclude='_test*.so' --exclude='_ctypes_test*.so' \
            --exclude='_xxtestfuzz*.so' --exclude='xxlimited*.so' \
            . | tar -C "$ROOT$d" -xf -
    done
    # Bytecode: without it every kernel start compiles the modules the runner imports
    # (about 100 ms). Compile in the rootfs, with the paths the image will have.
    for d in "${dirs[@]}"; do
        "$pybin" -m compileall -q -j 0 -s "$ROOT" -p / "$ROOT$d" >/dev/null 2>&1 || log "WARNING: compileall of $d failed"
    done
    # Symlinks inside the stdlib that point outside it (e.g. Debian's
    # sitecustomize.py -> /etc/python3.11/sitecustomize.py) would dangle in the
    # image; replace links to files by copies.
    local link hostpath
    while IFS= read -r -d '' link; do
        hostpath="${link#"$ROOT"}"
        if [ -f "$hostpath" ]; then
            rm -f "$link"
            cp -L "$hostpath" "$link"
        fi
    done < <(find "$ROOT" -type l -print0)

    # 3. shared libraries of the binary and of every extension module
    local objs=("$pybin") f
    if [ -d "$ROOT$dynload" ]; then
        while IFS= read -r -d '' f; do
            objs+=("${f#"$ROOT"}")
        done < <(find "$ROOT$dynload" -name '*.so' -print0)
    fi
    local libs missing=0 lib
    libs=$(
        for f in "${objs[@]}"; do
            # awk (not grep) so that "no match" is not an error under pipefail
            LC_ALL=C ldd "$f" 2>/dev/null | awk '
                $2 == "=>" && $3 ~ /^\// { print $3; next }
                $2 == "=>" && $3 == "not" { print "MISSING:" $1; next }
                $1 ~ /^\// { print $1 }' || true
        done | sort -u
    )
    while IFS= read -r lib; do
        [ -n "$lib" ] || continue
        case "$lib" in
            MISSING:*) log "WARNING: unresolved library ${lib#MISSING:}"; missing=1; continue ;;
        esac
        copy_same_path "$lib"
    done <<<"$libs"
    [ "$missing" -eq 0 ] || log "WARNING: some extension modules will not import"
    # the dynamic loader (also listed by ldd, but be explicit)
    if [ -e /lib64/ld-linux-x86-64.so.2 ]; then
        copy_same_path /lib64/ld-linux-x86-64.so.2
    fi
    log "copied $(printf '%s\n' "$libs" | grep -vc '^MISSING:' || true) shared libraries"

    # 4. convenience symlinks to the interpreter
    link_if_absent "$pybin" /usr/bin/python3
    link_if_absent "$pybin" /usr/bin/python
    link_if_absent "$pybin" /usr/local/bin/python3

    # 5. /bin/sh and friends
    install_busybox

    # 6. users, dirs
    make_base_dirs
    chown 1000:1000 "$ROOT/home/work"
    mkdir -p "$ROOT/etc"
    cat >"$ROOT/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/bin/sh
work:x:1000:1000:work:/home/work:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
EOF
    cat >"$ROOT/etc/group" <<'EOF'
root:x:0:
work:x:1000:
nogroup:x:65534:
EOF
    chmod 0644 "$ROOT/etc/passwd" "$ROOT/etc/group"
    # intermediate dirs (e.g. /root for pyenv builds) must be traversable by uid 1000
    local dpath="$pybin"
    while dpath=$(dirname "$dpath") && [ "$dpath" != / ]; do
        chmod a+rx "$ROOT$dpath"
    done

    import_rootfs \
        --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin' \
        --change 'ENV LANG=C.UTF-8' \
        --change 'WORKDIR /home/work' \
        --change 'LABEL ai.backend.kernelspec=1' \
        --change 'LABEL ai.backend.features="query batch"' \
        --change 'LABEL ai.backend.runtime-path=/usr/bin/python3'

    # verification
    local mods=json,socket,threading,subprocess,base64,select m out
    for m in ssl sqlite3; do
        if "$py" -c "import $m" >/dev/null 2>&1; then
            mods="$mods,$m"
        else
            log "note: host python lacks $m; not checking it"
        fi
    done
    out=$(docker run --rm --network none "$NAME" python3 -c "import $mods;print(42)") \
        || die "verification of $NAME failed: python3 -c 'import $mods'"
    [ "$out" = 42 ] || die "verification of $NAME: expected 42, got '$out'"
    log "verify: python3 -c 'import $mods;print(42)' -> $out"
    out=$(docker run --rm --network none "$NAME" sh -c 'echo ok') || die "verification of $NAME failed: sh"
    [ "$out" = ok ] || die "verification of $NAME: expected ok, got '$out'"
    log "verify: sh -c 'echo ok' -> $out"
    out=$(docker run --rm --network none --user 1000:1000 "$NAME" python3 -c 'import os;print(os.getuid())') \
        || die "verification of $NAME failed: python3 as uid 1000"
    [ "$out" = 1000 ] || die "verification of $NAME as uid 1000: got '$out'"
    log "verify: python3 as uid 1000 -> ok"
    report
}

case "$KIND" in
    python) build_python ;;
    busybox) build_busybox ;;
esac

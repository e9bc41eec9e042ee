#!/usr/bin/env bash
# Build bai kernel images without a container registry.
#
#   packaging/build-kernel-image.sh [--force] python  [IMAGE_NAME]   # default bai-python:3.11
#   packaging/build-kernel-image.sh [--force] busybox [IMAGE_NAME]   # default bai-busybox:latest
#   packaging/build-kernel-image.sh [--force] jupyter [IMAGE_NAME]   # default bai-jupyter:latest
#   packaging/build-kernel-image.sh [--force] sshd    [IMAGE_NAME]   # default bai-sshd:latest
#
# "python" copies the host's CPython 3.11 (binary, stdlib, lib-dynload and every
# shared library they need) plus a static busybox into a rootfs, at the same
# absolute paths as on the host, and `docker import`s it.  "busybox" imports a
# rootfs containing only a static busybox.  "jupyter" pip-installs JupyterLab,
# Notebook 7 and ipykernel from PyPI with the host's copy of the python image's
# interpreter (same path, same version) and `docker build`s them as one layer
# on top of the python image (built first when missing); see build_jupyter.
# "sshd" adds OpenSSH's sshd, ssh, ssh-keygen (and scp, sftp-server) with the
# shared libraries they need to the python image, as one layer; see build_sshd.
#
# Without --force an image that already exists is left alone.
set -euo pipefail
umask 022

usage() {
    echo "usage: $0 [--force] {python|busybox|jupyter|sshd} [IMAGE_NAME]" >&2
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
    jupyter) NAME="${NAME:-bai-jupyter:latest}" ;;
    sshd) NAME="${NAME:-bai-sshd:latest}" ;;
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
    # app "web" (service port web:http:8080): a static file server for /home/work
    mkdir -p "$ROOT/etc/backend.ai/service-defs"
    cat >"$ROOT/etc/backend.ai/service-defs/web.json" <<'EOF'
{"command": ["{runtime_path}", "-m", "http.server", "--bind", "0.0.0.0", "{ports[0]}"], "url_template": "{protocol}://{host}:{port}/"}
EOF
    chmod 0755 "$ROOT/etc/backend.ai" "$ROOT/etc/backend.ai/service-defs"
    chmod 0644 "$ROOT/etc/backend.ai/service-defs/web.json"
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
        --change 'LABEL ai.backend.runtime-path=/usr/bin/python3' \
        --change 'LABEL ai.backend.service-ports=web:http:8080'

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

# ---------------------------------------------------------------------------
# jupyter image
# ---------------------------------------------------------------------------
# JupyterLab 4 + Notebook 7 + ipykernel on top of the python image.  The packages are
# pip-installed on the host with the very interpreter the python image carries (it sits at
# the same absolute path on the host), under that interpreter's prefix, so that inside the
# image `/usr/bin/python3 -m jupyterlab` just works and Jupyter finds its data files in
# sys.prefix/share/jupyter.  The tree becomes one layer (`ADD jupyter.tar /`, which keeps
# hard links) on top of the python image.
#
# Apps (label ai.backend.service-ports, /etc/backend.ai/service-defs/*.json):
#   jupyterlab:http:8090  JupyterLab (url /lab)
#   jupyter:http:8080     the Notebook 7 UI (classic-notebook look: file browser at /tree)
# Both start with a secret: `--IdentityProvider.token={token}` (Jupyter Server 2's option; the
# kernel's runner puts the app's token there, and bai shows it only to the session's owner, in
# the app's URL), no password, and Jupyter's own same-origin checks (no allow_origin=*): users of
# a node share its loopback, so whoever reaches the port without the token gets 403 / the login
# page.  Rooted at /home/work, with the Jupyter runtime dir in /tmp; config, data and workspaces
# stay in the defaults under HOME=/home/work (the root filesystem is read-only).
JUPYTER_PACKAGES="${BAI_JUPYTER_PACKAGES:-jupyterlab>=4,<5 notebook>=7,<8 ipykernel>=6}"
JUPYTER_BASE="${BAI_JUPYTER_BASE_IMAGE:-bai-python:3.11}"

build_jupyter() {
    if ! docker image inspect "$JUPYTER_BASE" >/dev/null 2>&1; then
        log "base image $JUPYTER_BASE missing; building it"
        bash "$0" python "$JUPYTER_BASE" || die "building $JUPYTER_BASE failed"
    fi
    local info pybin prefix purelib version hostversion
    info=$(docker run --rm --network none "$JUPYTER_BASE" python3 -c '
import os, sys, sysconfig
print(os.path.realpath(sys.executable)); print(sys.prefix)
print(sysconfig.get_path("purelib")); print(sys.version)') || die "cannot run python3 in $JUPYTER_BASE"
    { read -r pybin; read -r prefix; read -r purelib; read -r version; } <<<"$info"
    log "base $JUPYTER_BASE: interpreter $pybin, prefix $prefix"
    [ -x "$pybin" ] || die "$pybin (the interpreter of $JUPYTER_BASE) is not on this host; rebuild $JUPYTER_BASE with --force"
    hostversion=$("$pybin" -c 'import sys; print(sys.version)')
    [ "$hostversion" = "$version" ] || die "host $pybin is $hostversion, $JUPYTER_BASE has $version; rebuild $JUPYTER_BASE with --force"
    "$pybin" -m pip --version >/dev/null 2>&1 || die "$pybin has no pip"

    local stage="$TMP/stage" ctx="$TMP/ctx" sp
    mkdir -p "$stage" "$ctx"
    chmod 0755 "$stage"
    sp="$stage$purelib"
    # 1. the packages, as if installed into the interpreter's own prefix
    log "pip install $JUPYTER_PACKAGES"
    # shellcheck disable=SC2086  # word-splitting the package list is intended
    PYTHONNOUSERSITE=1 PIP_DISABLE_PIP_VERSION_CHECK=1 "$pybin" -m pip install -q \
        --root "$stage" --prefix "$prefix" --ignore-installed --no-compile \
        --no-warn-script-location --no-warn-conflicts --root-user-action=ignore $JUPYTER_PACKAGES \
        || die "pip install failed"
    [ -d "$sp/jupyterlab" ] && [ -d "$sp/ipykernel" ] || die "pip did not install into $sp"

    # 2. trim: the debugger backend (ipykernel runs without it; only JupyterLab's debugger
    #    panel needs it), test suites, and babel's locale data except English (JupyterLab
    #    looks up the display names of installed language packs; there are none but English)
    rm -rf "$sp"/debugpy "$sp"/debugpy-*.dist-info "$stage$prefix"/bin/debugpy*
    find "$sp" -depth -type d \( -name tests -o -name __pycache__ \) -exec rm -rf {} +
    if [ -d "$sp/babel/locale-data" ]; then
        find "$sp/babel/locale-data" -type f ! -name 'root.dat' ! -name 'en.dat' ! -name 'en_*.dat' -delete
    fi
    # identical files (JupyterLab's static assets exist twice) become hard links
    "$pybin" - "$stage" <<'PYEOF'
import hashlib, os, sys
seen, saved = {}, 0
for d, _, files in os.walk(sys.argv[1]):
    for f in files:
        p = os.path.join(d, f)
        st = os.lstat(p)
        if not os.path.isfile(p) or os.path.islink(p) or st.st_size < 4096:
            continue
        with open(p, "rb") as fh:
            key = (st.st_size, st.st_mode, hashlib.sha256(fh.read()).digest())
        if key in seen:
            os.unlink(p)
            os.link(seen[key], p)
            saved += st.st_size
        else:
            seen[key] = p
print(f"[build-kernel-image] hard-linked duplicates: {saved / 1048576:.1f} MiB saved")
PYEOF
    # 3. bytecode (the root filesystem is read-only: without it every start compiles)
    "$pybin" -m compileall -q -j 0 -s "$stage" -p / "$sp" >/dev/null 2>&1 || log "WARNING: compileall reported errors"

    # 4. shared libraries the extension modules need that the base image lacks (libstdc++ ...)
    local libs lib missing
    libs=$(find "$stage" -name '*.so*' -type f -print0 | xargs -0 -r -n 50 sh -c 'LC_ALL=C ldd "$@" 2>/dev/null' ldd |
        awk -v stage="$stage" '$2 == "=>" && $3 ~ /^\// && index($3, stage) != 1 { print $3 }
                               $2 == "=>" && $3 == "not" { print "MISSING:" $1 }' | sort -u)
    if grep -q '^MISSING:' <<<"$libs"; then
        log "WARNING: unresolved libraries: $(grep '^MISSING:' <<<"$libs" | tr '\n' ' ')"
        libs=$(grep -v '^MISSING:' <<<"$libs" || true)
    fi
    if [ -n "$libs" ]; then
        # shellcheck disable=SC2046
        missing=$(docker run --rm --network none "$JUPYTER_BASE" sh -c \
            'for f in "$@"; do [ -e "$f" ] || echo "$f"; done' sh $(echo $libs))
        while IFS= read -r lib; do
            [ -n "$lib" ] || continue
            mkdir -p "$stage$(dirname "$lib")"
            cp -L "$lib" "$stage$lib"
            log "added library $lib"
        done <<<"$missing"
    fi

    # 5. JupyterLab defaults: kernels usually have no network, so no news/update checks (and
    #    no "Would you like to get notified about official Jupyter news?" toast)
    mkdir -p "$stage$prefix/share/jupyter/lab/settings"
    cat >"$stage$prefix/share/jupyter/lab/settings/overrides.json" <<'EOF'
{
  "@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": false}
}
EOF
    # app definitions
    mkdir -p "$stage/etc/backend.ai/service-defs"
    cat >"$stage/etc/backend.ai/service-defs/jupyterlab.json" <<'EOF'
{
  "command": [
    "{runtime_path}", "-m", "jupyterlab",
    "--no-browser", "--ip=0.0.0.0", "--port={ports[0]}",
    "--IdentityProvider.token={token}",
    "--ServerApp.root_dir=/home/work"
  ],
  "env": {"JUPYTER_RUNTIME_DIR": "/tmp/jupyter-runtime"},
  "url_template": "{protocol}://{host}:{port}/lab"
}
EOF
    cat >"$stage/etc/backend.ai/service-defs/jupyter.json" <<'EOF'
{
  "command": [
    "{runtime_path}", "-m", "notebook",
    "--no-browser", "--ip=0.0.0.0", "--port={ports[0]}",
    "--IdentityProvider.token={token}",
    "--ServerApp.root_dir=/home/work"
  ],
  "env": {"JUPYTER_RUNTIME_DIR": "/tmp/jupyter-runtime"},
  "url_template": "{protocol}://{host}:{port}/tree"
}
EOF
    chmod -R u=rwX,go=rX "$stage"

    # 6. one layer on top of the base image
    tar --numeric-owner --owner=0 --group=0 -C "$stage" -cf "$ctx/jupyter.tar" .
    cat >"$ctx/Dockerfile" <<EOF
FROM $JUPYTER_BASE
ADD jupyter.tar /
ENV PATH=/usr/local/bin:/usr/bin:/bin:$prefix/bin
LABEL ai.backend.kernelspec=1 \\
      ai.backend.features="query batch" \\
      ai.backend.runtime-path=/usr/bin/python3 \\
      ai.backend.service-ports=jupyter:http:8080,jupyterlab:http:8090
EOF
    # the legacy builder: BuildKit is not always installed, and this needs none of it
    DOCKER_BUILDKIT=0 docker build -q -t "$NAME" "$ctx" >/dev/null 2>"$TMP/build.err" \
        || die "docker build failed: $(cat "$TMP/build.err")"

    # verification: start both apps exactly as their service definitions say, in a container
    # confined like a kernel, fetch their pages, and run code in a Python kernel
    local out line
    out=$(docker run --rm --network none --read-only --tmpfs /tmp \
        --tmpfs /home/work:uid=1000,gid=1000,mode=755 --user 1000:1000 "$NAME" python3 -c '
import json, os, subprocess, sys, time, urllib.request

import secrets, urllib.error

def get(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()

def status(url):
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code

procs = []
for name, port, path, marker in (("jupyterlab", 8090, "/lab", "JupyterLab"), ("jupyter", 8080, "/tree", "Jupyter Notebook")):
    sdef = json.load(open(f"/etc/backend.ai/service-defs/{name}.json"))
    token = secrets.token_urlsafe(24)
    assert any("{token}" in a for a in sdef["command"]), (name, "starts without a secret")
    assert not any("allow_origin" in a for a in sdef["command"]), (name, "allows any origin")
    cmd = [a.replace("{runtime_path}", "/usr/bin/python3").replace("{ports[0]}", str(port)).replace("{token}", token) for a in sdef["command"]]
    procs.append(subprocess.Popen(cmd, env={**os.environ, **sdef.get("env", {})}, stdout=subprocess.DEVNULL, stderr=open(f"/tmp/{name}.log", "w")))
    t0 = time.monotonic()
    deadline = t0 + 60
    while True:
        try:
            page = get(f"http://127.0.0.1:{port}{path}?token={token}")
            break
        except OSError:
            if time.monotonic() > deadline or procs[-1].poll() is not None:
                sys.exit(f"{name} did not answer:\n" + open(f"/tmp/{name}.log").read()[-3000:])
            time.sleep(0.3)
    assert marker in page, (name, page[:500])
    refused = status(f"http://127.0.0.1:{port}/api/contents")
    assert refused == 403, (name, "without its token /api/contents answered", refused)
    print(f"{name}: {path} answered after {time.monotonic() - t0:.1f} s; without the token /api/contents is {refused}")
# a Python kernel (what notebooks run on) executes code
from jupyter_client.manager import start_new_kernel
km, kc = start_new_kernel(kernel_name="python3", startup_timeout=60)
texts = []
def hook(msg):
    if msg["msg_type"] == "stream":
        texts.append(msg["content"]["text"])
kc.execute_interactive("print(6*7)", output_hook=hook, timeout=60)
kc.stop_channels()
km.shutdown_kernel(now=True)
assert "".join(texts).strip() == "42", texts
print("kernel python3: print(6*7) ->", "".join(texts).strip())
for p in procs:
    p.terminate()
for p in procs:
    p.wait(20)
' 2>"$TMP/verify.err") || die "verification of $NAME failed: $out $(tail -c 3000 "$TMP/verify.err")"
    while IFS= read -r line; do log "verify: $line"; done <<<"$out"
    report
}

# ---------------------------------------------------------------------------
# sshd image
# ---------------------------------------------------------------------------
# The python image plus OpenSSH (Debian's openssh-server / openssh-client), for multi-container
# sessions: kernels `ssh sub1` each other on port 2200 with the session's key (~/.ssh). The
# binaries come from the host when openssh-server is installed there (CI installs it), else from
# `apt-get download` + `dpkg -x` (nothing installed on the host); with every shared library they
# need that the base image lacks, at the same paths, as one layer.
#
# sshd runs as the kernel's user (uid 1000: no root, so no privilege-separation chroot and no
# capabilities needed) with a root filesystem that is read-only: whoever starts it gives it a host
# key in a writable place (`sshd -h /home/work/.ssh/host_key` or under /tmp). /etc/ssh/sshd_config
# allows public keys only (~/.ssh/authorized_keys), on port 2200.
SSHD_BASE="${BAI_SSHD_BASE_IMAGE:-bai-python:3.11}"

build_sshd() {
    if ! docker image inspect "$SSHD_BASE" >/dev/null 2>&1; then
        log "base image $SSHD_BASE missing; building it"
        bash "$0" python "$SSHD_BASE" || die "building $SSHD_BASE failed"
    fi
    local src="" deb="$TMP/deb" stage="$TMP/stage" ctx="$TMP/ctx" libpath=""
    mkdir -p "$stage" "$ctx"
    chmod 0755 "$stage"
    # BAI_SSHD_SOURCE=download: fetch the packages even when the host has them
    if [ "${BAI_SSHD_SOURCE:-host}" != download ] && [ -x /usr/sbin/sshd ] && [ -x /usr/bin/ssh ] && [ -x /usr/bin/ssh-keygen ] \
        && ! LC_ALL=C ldd /usr/sbin/sshd 2>/dev/null | grep -q 'not found'; then
        log "OpenSSH from the host ($(/usr/sbin/sshd -V 2>&1 | head -n 1 || true))"
    else
        # the host lacks openssh-server (or a library of it): fetch the packages without installing them
        log "openssh-server not on the host: apt-get download openssh-server openssh-client openssh-sftp-server libwrap0"
        mkdir -p "$deb/pkgs"
        chmod 0777 "$deb/pkgs"  # apt's sandbox user writes there
        (cd "$deb/pkgs" && apt-get download -q openssh-server openssh-client openssh-sftp-server libwrap0 >&2) \
            || die "apt-get download of openssh-server failed (no apt mirror reachable?): install openssh-server on the host instead"
        local f
        for f in "$deb"/pkgs/*.deb; do dpkg -x "$f" "$deb/root" || die "dpkg -x $f failed"; done
        src="$deb/root"
        libpath="$src/lib/x86_64-linux-gnu:$src/usr/lib/x86_64-linux-gnu"
    fi
    # 1. the programs, at their Debian paths
    local prog progs=(/usr/sbin/sshd /usr/bin/ssh /usr/bin/ssh-keygen /usr/bin/scp /usr/lib/openssh/sftp-server)
    for prog in "${progs[@]}"; do
        if [ -x "$src$prog" ]; then
            mkdir -p "$stage$(dirname "$prog")"
            cp -L "$src$prog" "$stage$prog"
            chmod 0755 "$stage$prog"
        else
            case "$prog" in
                /usr/sbin/sshd|/usr/bin/ssh|/usr/bin/ssh-keygen) die "$prog not found in $src/" ;;
                *) log "note: $prog not found; left out" ;;
            esac
        fi
    done
    mkdir -p "$stage/etc/ssh"
    if [ -f "$src/etc/ssh/moduli" ]; then cp "$src/etc/ssh/moduli" "$stage/etc/ssh/moduli"; fi
    # 2. the shared libraries the base image lacks (from the host, or from the downloaded packages)
    local libs lib missing
    libs=$(for prog in "${progs[@]}"; do
        [ -e "$stage$prog" ] || continue
        LC_ALL=C LD_LIBRARY_PATH="$libpath" ldd "$stage$prog" 2>/dev/null | awk '
            $2 == "=>" && $3 ~ /^\// { print $3; next }
            $2 == "=>" && $3 == "not" { print "MISSING:" $1 }' || true
    done | sort -u)
    if grep -q '^MISSING:' <<<"$libs"; then
        die "unresolved libraries: $(grep '^MISSING:' <<<"$libs" | tr '\n' ' ')"
    fi
    if [ -n "$libs" ]; then
        local paths=()
        while IFS= read -r lib; do
            [ -n "$lib" ] && paths+=("${lib#"$src"}")
        done <<<"$libs"
        missing=$(docker run --rm --network none "$SSHD_BASE" sh -c \
            'for f in "$@"; do [ -e "$f" ] || echo "$f"; done' sh "${paths[@]}")
        while IFS= read -r lib; do
            [ -n "$lib" ] || continue
            mkdir -p "$stage$(dirname "$lib")"
            if [ -n "$src" ] && [ -e "$src$lib" ]; then cp -L "$src$lib" "$stage$lib"; else cp -L "$lib" "$stage$lib"; fi
            log "added library $lib"
        done <<<"$missing"
    fi
    # 3. configuration: the privilege-separation user and directory (used only when sshd runs as root),
    #    and a daemon configuration for kernels
    docker run --rm --network none "$SSHD_BASE" cat /etc/passwd >"$stage/etc/passwd" || die "cannot read $SSHD_BASE's /etc/passwd"
    grep -q '^sshd:' "$stage/etc/passwd" || echo 'sshd:x:101:65534::/run/sshd:/bin/false' >>"$stage/etc/passwd"
    chmod 0644 "$stage/etc/passwd"
    mkdir -p "$stage/run/sshd"
    chmod 0755 "$stage/run/sshd"
    cat >"$stage/etc/ssh/sshd_config" <<'EOF'
# bai kernels: sshd runs as the kernel's user on port 2200; public keys only. The root filesystem is
# read-only: give the host key with -h (e.g. sshd -h /home/work/.ssh/host_key).
Port 2200
PidFile none
UsePAM no
PermitRootLogin no
PubkeyAuthentication yes
AuthorizedKeysFile .ssh/authorized_keys
PasswordAuthentication no
KbdInteractiveAuthentication no
# the kernel's home is a fresh scratch owned by its user; Docker's tmpfs modes are not the point
StrictModes no
PrintMotd no
PrintLastLog no
X11Forwarding no
Subsystem sftp /usr/lib/openssh/sftp-server
EOF
    chmod -R u=rwX,go=rX "$stage"
    chmod 0755 "$stage/usr/sbin/sshd" "$stage/usr/bin/ssh" "$stage/usr/bin/ssh-keygen"

    # 4. one layer on top of the base image (its labels, user and environment stay)
    tar --numeric-owner --owner=0 --group=0 -C "$stage" -cf "$ctx/sshd.tar" .
    cat >"$ctx/Dockerfile" <<EOF
FROM $SSHD_BASE
ADD sshd.tar /
EOF
    DOCKER_BUILDKIT=0 docker build -q -t "$NAME" "$ctx" >/dev/null 2>"$TMP/build.err" \
        || die "docker build failed: $(cat "$TMP/build.err")"

    # verification: confined like a kernel (uid 1000, read-only root, no capabilities, no network but
    # loopback), sshd with a fresh host key, then `ssh 127.0.0.1 hostname` with a fresh user key
    local out
    out=$(docker run --rm --network none --hostname sshcheck --read-only --tmpfs /tmp \
        --tmpfs /home/work:uid=1000,gid=1000,mode=755 --user 1000:1000 --cap-drop ALL \
        --security-opt no-new-privileges "$NAME" sh -c '
set -e
mkdir -m 700 -p /home/work/.ssh
ssh-keygen -q -t ed25519 -N "" -f /tmp/host_key
ssh-keygen -q -t ed25519 -N "" -C check -f /home/work/.ssh/id_check
cp /home/work/.ssh/id_check.pub /home/work/.ssh/authorized_keys
/usr/sbin/sshd -h /tmp/host_key -E /tmp/sshd.log
for i in $(seq 50); do
    if ssh -q -i /home/work/.ssh/id_check -p 2200 -o BatchMode=yes -o StrictHostKeyChecking=no \
        -o UserKnownHostsFile=/dev/null -o ConnectTimeout=2 127.0.0.1 hostname 2>/tmp/ssh.err; then exit 0; fi
    sleep 0.1
done
cat /tmp/sshd.log /tmp/ssh.err >&2
exit 1' 2>"$TMP/verify.err") || die "verification of $NAME failed: $out $(tail -c 3000 "$TMP/verify.err")"
    [ "$out" = sshcheck ] || die "verification of $NAME: ssh 127.0.0.1 hostname printed '$out', not sshcheck"
    log "verify: sshd as uid 1000 on 2200, ssh 127.0.0.1 hostname -> $out"
    out=$(docker run --rm --network none "$NAME" python3 -c 'print(42)') || die "verification of $NAME failed: python3"
    [ "$out" = 42 ] || die "verification of $NAME: python3 printed '$out'"
    report
}

case "$KIND" in
    python) build_python ;;
    busybox) build_busybox ;;
    jupyter) build_jupyter ;;
    sshd) build_sshd ;;
esac

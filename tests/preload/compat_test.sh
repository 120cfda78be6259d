#!/usr/bin/env bash
# More real Debian programs, servers and clients, preloaded at both ends on
# loopback (docs/preload.md, "Compatibility"): compat_test.sh CASE RUN LIB
#   socat        a file piped listener <- client, the reverse, and through a
#                listener whose sha256sum child answers (socat carries both)
#   socat-proxy  socat (fork per connection) in front of python3's
#                http.server; curl downloads through it
#   nc           netcat-openbsd: nc -l <- nc, then nc -l -> nc
#   memcached    memcached (threads) filled by a Python text-protocol client
#                and read back, a file through memccp/memccat, memcslap
#   haproxy      haproxy (threads) in front of nginx (master + workers);
#                curl downloads through it
#   nginx-proxy  nginx as Debian runs it (master root, workers www-data) as a
#                reverse proxy to python3's http.server; curl through it
#   node         node's http server and a node client (keep-alive agent)
#   node-cluster node's cluster module, round robin: the primary accepts and
#                hands each connection to a worker over its IPC channel; GETs
#                and POSTs verified, the workers adopt every connection, and
#                the server is idle once its clients are done
#   node-destroy a node server that destroys each connection after its
#                answer (libuv closes with syscall()) and then reads a file,
#                which may get the connection's number: the client sees the
#                end, the file its own bytes
#   node-handoff a node server reads each connection's first bytes, then
#                hands the socket to a child process (child_process.fork,
#                IPC) that answers; the parent closes its copy and must
#                then be idle
#   redis-replica  a redis master and its replica: diskless full sync (the
#                master forks a child that streams the snapshot through it),
#                then live replication of later writes
#   python-http  python3 -m http.server (a thread per connection) + urllib
#   mosquitto    mosquitto, mosquitto_sub and mosquitto_pub (QoS 1)
#   lighttpd     lighttpd (one event loop) with curl and ab -k
#   mariadb      mariadbd (a thread per connection), a blob through the
#                mariadb client both ways, sysbench oltp_read_write
#   socat-stdio  socat hands each connection to sha256sum (EXEC, nofork),
#                which reads it through stdio: clients told at once
#   socket-activate  systemd-socket-activate --inetd: its service runs with a
#                fresh environment (not preloaded); clients stay on kernel
#                TCP, told at once
#   rsyncd       rsync's daemon (a fork per connection): a tree pulled, a file
#                pushed (the client forks a receiver that waits first)
#   git-daemon   git daemon (forks and execs upload-pack/receive-pack per
#                connection): clone, push (the client's exec'd pack-objects
#                writes the pack while its parent reads the server's answer),
#                clone of what was pushed
# Every connection must take the shm path on both ends; the bytes that moved
# are checked against what was sent.
set -euo pipefail
case_name=$1 run=$(realpath "$2") lib=$(realpath "$3")
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d /tmp/rdmakit-compat.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
log=$work/log
: >"$log"
fail() { echo "FAIL [$case_name]: $*" >&2; sed 's/^/  log: /' "$log" >&2 2>/dev/null || true; exit 1; }
need() { command -v "$1" >/dev/null || fail "$1 is not installed (scripts/deps.sh installs it)"; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_listen() {  # up to 20 s for a server to listen on port $1
  for _ in $(seq 400); do ss -ltn "sport = :$1" | grep -q LISTEN && return 0; sleep 0.05; done
  fail "no server listening on port $1 after 20 s: $(tail -n 5 "$work"/*.out 2>/dev/null)"
}
mkdir -m 700 "$work/rdv"
# An array, not a function: "${pre[@]}" CMD & is one process whose pid is $!.
pre=("$run" --lib "$lib" --log "$log" --dir "$work/rdv")
bg() { "${pre[@]}" timeout 60 "$@" & pids+=($!); }
count() { grep -cE "$1" "$log" || true; }
# expect_shm CONNECTS ACCEPTS: exactly that many connections on shm at each
# end, none off the fast path.
expect_shm() {
  local c a
  c=$(count "\]: connect fd=[0-9]+ .*path=shm") a=$(count "\]: accept fd=[0-9]+ .*path=shm")
  [ "$c" = "$1" ] && [ "$a" = "$2" ] ||
    fail "expected $1 connects and $2 accepts on shm, found $c and $a"
  [ "$(count 'path=kernel|path=none')" = 0 ] ||
    fail "connections off the fast path: $(grep -E 'path=kernel|path=none' "$log")"
}
sha() { sha256sum <"$1" | cut -d' ' -f1; }
# The head of an nginx.conf under $work/ngx up to the http block's first
# lines (master + 2 workers, epoll): nginx_conf_head "USER GROUP".
nginx_conf_head() {
  cat <<NGINX
daemon off;
master_process on;
worker_processes 2;
user $1;
pid $work/ngx/nginx.pid;
error_log $work/ngx/error.log info;
events { use epoll; worker_connections 512; }
http {
  access_log off;
  client_body_temp_path $work/ngx/body; proxy_temp_path $work/ngx/proxy;
  fastcgi_temp_path $work/ngx/fcgi; uwsgi_temp_path $work/ngx/uwsgi; scgi_temp_path $work/ngx/scgi;
NGINX
}
# three_digests_told REASON: three socat clients send $work/up to the server
# on $port, which answers its sha256sum; each digest must be right and each
# client must have been told REASON at once (kernel TCP, no budget waited).
three_digests_told() {
  local i got told want; want=$(sha "$work/up")
  for i in 1 2 3; do
    got=$("${pre[@]}" timeout 30 socat -t 20 - "TCP:127.0.0.1:$port" <"$work/up") ||
      fail "client $i"
    [ "${got%% *}" = "$want" ] || fail "client $i: digest $got"
  done
  told=$(count "connect fd=[0-9]+ .*path=kernel reason=$1")
  [ "$told" = 3 ] || fail "expected 3 clients told '$1', found $told"
  [ "$(count 'path=shm|path=none|within [0-9]+ ms')" = 0 ] || fail "unexpected paths or waits"
}

case "$case_name" in
  socat)
    need socat
    head -c 20000000 /dev/urandom >"$work/up"
    # 1. client -> listener
    port=$(free_port)
    bg socat -u "TCP-LISTEN:$port,bind=127.0.0.1,reuseaddr" "CREATE:$work/got1"; s=$!
    wait_listen "$port"
    "${pre[@]}" timeout 30 socat -u "OPEN:$work/up" "TCP:127.0.0.1:$port" || fail "socat client 1"
    wait "$s" || fail "socat listener 1"
    cmp -s "$work/up" "$work/got1" || fail "listener received other bytes"
    # 2. listener -> client
    port=$(free_port)
    bg socat -u "OPEN:$work/up" "TCP-LISTEN:$port,bind=127.0.0.1,reuseaddr"; s=$!
    wait_listen "$port"
    "${pre[@]}" timeout 30 socat -u "TCP:127.0.0.1:$port" "CREATE:$work/got2" || fail "socat client 2"
    wait "$s" || fail "socat listener 2"
    cmp -s "$work/up" "$work/got2" || fail "client received other bytes"
    # 3. both ways: the listener runs sha256sum on what it reads, the digest
    # comes back on the same connection after the client's half-close.
    port=$(free_port)
    bg socat "TCP-LISTEN:$port,bind=127.0.0.1,reuseaddr" "EXEC:sha256sum"; s=$!
    wait_listen "$port"
    got=$("${pre[@]}" timeout 30 socat -t 20 - "TCP:127.0.0.1:$port" <"$work/up") || fail "socat client 3"
    wait "$s" || fail "socat listener 3"
    [ "${got%% *}" = "$(sha "$work/up")" ] || fail "digest $got, sent $(sha "$work/up")"
    expect_shm 3 3
    echo "OK socat: 20 MB each way and a round trip over 3 shm connections"
    ;;
  socat-proxy)
    need socat; need curl
    mkdir "$work/www"
    head -c 20000000 /dev/urandom >"$work/www/file.bin"
    back=$(free_port) front=$(free_port)
    bg python3 -m http.server --bind 127.0.0.1 --directory "$work/www" "$back" >"$work/http.out" 2>&1
    bg socat "TCP-LISTEN:$front,bind=127.0.0.1,reuseaddr,fork" "TCP:127.0.0.1:$back"
    wait_listen "$back"; wait_listen "$front"
    for i in 1 2 3; do
      "${pre[@]}" timeout 30 curl -sS -o "$work/got" "http://127.0.0.1:$front/file.bin" || fail "curl $i"
      cmp -s "$work/www/file.bin" "$work/got" || fail "download $i differs"
    done
    # curl -> socat (accepted, served by a forked child) -> http.server
    [ "$(count "curl\]: connect fd=.*path=shm")" = 3 ] || fail "curl connections not on shm"
    [ "$(count "socat\]: connect fd=.*path=shm")" = 3 ] || fail "socat connections not on shm"
    # each accepted connection carried by its own forked child
    [ "$(grep -E "socat\]: accept fd=.*path=shm" "$log" | cut -d' ' -f1 | sort -u | wc -l)" = 3 ] ||
      fail "socat's connections not carried by 3 forked children"
    expect_shm 6 6
    echo "OK socat-proxy: 3 x 20 MB through socat, 6 shm connections"
    ;;
  nc)
    need nc
    head -c 20000000 /dev/urandom >"$work/up"
    port=$(free_port)
    "${pre[@]}" timeout 30 nc -l 127.0.0.1 "$port" </dev/null >"$work/got1" & s=$!; pids+=($s)
    wait_listen "$port"
    "${pre[@]}" timeout 30 nc -N 127.0.0.1 "$port" <"$work/up" >/dev/null || fail "nc client 1"
    wait "$s" || fail "nc -l 1"
    cmp -s "$work/up" "$work/got1" || fail "nc -l received other bytes"
    port=$(free_port)
    "${pre[@]}" timeout 30 nc -N -l 127.0.0.1 "$port" <"$work/up" >/dev/null & s=$!; pids+=($s)
    wait_listen "$port"
    "${pre[@]}" timeout 30 nc 127.0.0.1 "$port" </dev/null >"$work/got2" || fail "nc client 2"
    wait "$s" || fail "nc -l 2"
    cmp -s "$work/up" "$work/got2" || fail "nc received other bytes"
    expect_shm 2 2
    echo "OK nc: 20 MB each way over 2 shm connections"
    ;;
  memcached)
    need memcached; need memccp; need memccat; need memcslap
    port=$(free_port)
    bg memcached -u root -l 127.0.0.1 -p "$port" -U 0 -t 2 -m 256 -c 128 >"$work/mc.out" 2>&1
    wait_listen "$port"
    # 2000 keys with values of 1 B to 200 kB set over one connection, read
    # back over another (gets in batches of 50 keys).
    cat >"$work/mc.py" <<'PY'
import hashlib, random, socket, sys
port = int(sys.argv[1]); rng = random.Random(7)
vals = {f"k{i}": rng.randbytes(rng.choice([1, 100, 5000, 200000]) - rng.randrange(1)) for i in range(2000)}
def conn():
    s = socket.create_connection(("127.0.0.1", port), timeout=20); return s, s.makefile("rb")
s, f = conn()
for k, v in vals.items():
    s.sendall(b"set %s 0 0 %d\r\n%s\r\n" % (k.encode(), len(v), v))
for k in vals:
    line = f.readline()
    if line != b"STORED\r\n": sys.exit(f"set {k}: {line!r}")
s.close()
s, f = conn(); keys = list(vals); got = 0
for i in range(0, len(keys), 50):
    s.sendall(b"get " + " ".join(keys[i:i + 50]).encode() + b"\r\n")
    while True:
        line = f.readline()
        if line == b"END\r\n": break
        _, k, _, n = line.split(); data = f.read(int(n) + 2)[:-2]
        if data != vals[k.decode()]: sys.exit(f"value of {k} differs")
        got += 1
s.sendall(b"stats\r\n"); stats = {}
while (line := f.readline()) != b"END\r\n": p = line.split(); stats[p[1]] = p[2]
if got != len(vals): sys.exit(f"{got} of {len(vals)} keys read back")
print(got, sum(map(len, vals.values())), stats[b"curr_items"].decode())
PY
    out=$("${pre[@]}" timeout 30 python3 "$work/mc.py" "$port") || fail "python client: $out"
    set -- $out
    [ "$1" = 2000 ] && [ "$3" = 2000 ] || fail "python client: $out"
    head -c 500000 /dev/urandom >"$work/blob"
    (cd "$work" && "${pre[@]}" timeout 30 memccp --servers="127.0.0.1:$port" blob) || fail "memccp"
    "${pre[@]}" timeout 30 memccat --servers="127.0.0.1:$port" blob >"$work/blob.got" || fail "memccat"
    # memccat ends what it prints with a newline
    [ "$(stat -c %s "$work/blob.got")" = 500001 ] && head -c 500000 "$work/blob.got" | cmp -s - "$work/blob" ||
      fail "memccat returned other bytes"
    "${pre[@]}" timeout 30 memcslap --servers="127.0.0.1:$port" --concurrency=4 \
      --execute-number=2000 >"$work/slap.out" 2>&1 || fail "memcslap: $(cat "$work/slap.out")"
    grep -qE "^Time to set +8000 keys by +4 threads" "$work/slap.out" || fail "memcslap: $(cat "$work/slap.out")"
    # 2 python + memccp + memccat + 4 memcslap
    expect_shm 8 8
    echo "OK memcached: 2000 keys ($2 bytes) read back, 500 kB through memccp/memccat, memcslap set 8000 keys"
    ;;
  haproxy)
    need haproxy; need nginx; need curl
    mkdir -p "$work/www" "$work/ngx"
    head -c 20000000 /dev/urandom >"$work/www/file.bin"
    back=$(free_port) front=$(free_port)
    { nginx_conf_head "$(id -un) $(id -gn)"; cat <<NGINX
  server { listen 127.0.0.1:$back; root $work/www; }
}
NGINX
    } >"$work/nginx.conf"
    cat >"$work/haproxy.cfg" <<CFG
global
  nbthread 2
defaults
  mode http
  timeout connect 5s
  timeout client 30s
  timeout server 30s
frontend f
  bind 127.0.0.1:$front
  default_backend b
backend b
  http-reuse never
  server s1 127.0.0.1:$back
CFG
    bg nginx -c "$work/nginx.conf" -p "$work/ngx" -e "$work/ngx/error.log" >"$work/nginx.out" 2>&1; ngx=$!
    bg haproxy -db -f "$work/haproxy.cfg" >"$work/haproxy.out" 2>&1
    wait_listen "$back"; wait_listen "$front"
    for i in 1 2 3; do
      "${pre[@]}" timeout 30 curl -sS -o "$work/got" "http://127.0.0.1:$front/file.bin" ||
        fail "curl $i: $(tail -n 3 "$work/haproxy.out")"
      cmp -s "$work/www/file.bin" "$work/got" || fail "download $i differs"
    done
    for _ in $(seq 100); do [ -s "$work/ngx/nginx.pid" ] && break; sleep 0.05; done
    kill -QUIT "$(cat "$work/ngx/nginx.pid")"; wait "$ngx" 2>/dev/null || true
    [ "$(count "curl\]: connect fd=.*path=shm")" = 3 ] || fail "curl connections not on shm"
    [ "$(count "haproxy\]: connect fd=.*path=shm")" -ge 1 ] || fail "haproxy's backend connections not on shm"
    c=$(count "haproxy\]: connect fd=.*path=shm")
    expect_shm $((3 + c)) $((3 + c))
    echo "OK haproxy: 3 x 20 MB through haproxy from nginx, $((3 + c)) shm connections each end"
    ;;
  nginx-proxy)
    # nginx as Debian runs it: the master (root) listens, its workers run as
    # www-data; a reverse proxy to python3's http.server (keep-alive
    # upstream connections). Each client connection is accepted by a process
    # of another uid than the one that listened.
    need nginx; need curl
    [ "$(id -u)" = 0 ] || fail "nginx-proxy needs root (its workers drop to www-data)"
    mkdir -p "$work/www" "$work/ngx"
    # 300 kB, and 2 MB: nginx reads its upstream 4 kB at a time and, its
    # registration being edge-triggered, stops at a short read until the
    # next edge, which must come from the stream (epoll_before_connect.py).
    head -c 300000 /dev/urandom >"$work/www/small.bin"
    head -c 2000000 /dev/urandom >"$work/www/big.bin"
    back=$(free_port) front=$(free_port)
    { nginx_conf_head "www-data www-data"; cat <<NGINX
  upstream app { server 127.0.0.1:$back; keepalive 4; }
  server {
    listen 127.0.0.1:$front;
    location / {
      proxy_pass http://app;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }
  }
}
NGINX
    } >"$work/nginx.conf"
    bg python3 -m http.server -b 127.0.0.1 "$back" -d "$work/www" >"$work/py.out" 2>&1
    bg nginx -c "$work/nginx.conf" -p "$work/ngx" -e "$work/ngx/error.log" >"$work/nginx.out" 2>&1; ngx=$!
    wait_listen "$back"; wait_listen "$front"
    [ "$(ps -o user= -C nginx | grep -c www-data)" = 2 ] || fail "the nginx workers do not run as www-data"
    start=$(date +%s%N)
    for i in $(seq 10); do
      f=small.bin; [ $((i % 2)) = 0 ] && f=big.bin
      "${pre[@]}" timeout 10 curl -sS -o "$work/got" "http://127.0.0.1:$front/$f" ||
        fail "curl $i ($f, got $(stat -c %s "$work/got" 2>/dev/null) bytes): $(tail -n 3 "$work/ngx/error.log")"
      cmp -s "$work/www/$f" "$work/got" || fail "download $i ($f) differs"
    done
    took_ms=$((($(date +%s%N) - start) / 1000000))
    for _ in $(seq 100); do [ -s "$work/ngx/nginx.pid" ] && break; sleep 0.05; done
    kill -QUIT "$(cat "$work/ngx/nginx.pid")"; wait "$ngx" 2>/dev/null || true
    # Kernel TCP: well under a second for all ten; a client waiting for a
    # take-up that cannot come: 5 s each.
    [ "$took_ms" -lt 10000 ] || fail "10 downloads took $took_ms ms"
    [ "$(count "curl\]: connect fd=.*path=shm")" = 10 ] || fail "curl connections not on shm"
    [ "$(count "nginx: worker process\]: accept fd=.*path=shm")" = 10 ] ||
      fail "the workers (www-data) did not take every connection up on shm"
    u=$(count "nginx: worker process\]: connect fd=.*path=shm")
    [ "$u" -ge 1 ] || fail "the workers' upstream connections are not on shm"
    expect_shm $((10 + u)) $((10 + u))
    echo "OK nginx-proxy: 5 x 300 kB and 5 x 2 MB through nginx (workers as www-data) from http.server in $took_ms ms, $((10 + u)) shm connections each end"
    ;;
  node)
    need node
    port=$(free_port)
    cat >"$work/server.js" <<'JS'
const http = require('http'), crypto = require('crypto');
const big = crypto.randomBytes(20e6);
http.createServer((req, res) => {
  if (req.method === 'POST') {
    const h = crypto.createHash('sha256'); let n = 0;
    req.on('data', d => { h.update(d); n += d.length; });
    req.on('end', () => res.end(JSON.stringify({ n, sha: h.digest('hex') })));
  } else if (req.url === '/big') {
    res.setHeader('x-sha', crypto.createHash('sha256').update(big).digest('hex'));
    res.end(big);
  } else res.end('hello ' + req.url);
}).listen(+process.argv[2], '127.0.0.1');
JS
    cat >"$work/client.js" <<'JS'
const http = require('http'), crypto = require('crypto');
const agent = new http.Agent({ keepAlive: true, maxSockets: 4 });
const port = +process.argv[2];
function req(method, path, body) {
  return new Promise((ok, ko) => {
    const r = http.request({ host: '127.0.0.1', port, method, path, agent }, res => {
      const parts = []; res.on('data', d => parts.push(d));
      res.on('end', () => ok({ headers: res.headers, body: Buffer.concat(parts) }));
    });
    r.on('error', ko); r.end(body);
  });
}
(async () => {
  const small = await Promise.all([...Array(400).keys()].map(i => req('GET', '/' + i)));
  small.forEach((r, i) => { if (r.body.toString() !== 'hello /' + i) throw new Error('reply ' + i); });
  const big = await req('GET', '/big');
  const got = crypto.createHash('sha256').update(big.body).digest('hex');
  if (got !== big.headers['x-sha']) throw new Error('big download differs');
  const up = crypto.randomBytes(20e6);
  const r = JSON.parse((await req('POST', '/up', up)).body);
  if (r.n !== up.length || r.sha !== crypto.createHash('sha256').update(up).digest('hex'))
    throw new Error('upload differs');
  agent.destroy();
  console.log('400 requests, 20 MB each way');
})().catch(e => { console.error(e); process.exit(1); });
JS
    bg node "$work/server.js" "$port" >"$work/node.out" 2>&1
    wait_listen "$port"
    "${pre[@]}" timeout 30 node "$work/client.js" "$port" >"$work/client.out" 2>&1 ||
      fail "node client: $(cat "$work/client.out")"
    expect_shm 4 4
    echo "OK node: $(cat "$work/client.out") over 4 shm connections"
    ;;
  node-cluster)
    need node
    port=$(free_port)
    cat >"$work/server.js" <<'JS'
const cluster = require('cluster'), http = require('http'), crypto = require('crypto');
if (cluster.isPrimary) {
  cluster.schedulingPolicy = cluster.SCHED_RR;
  for (let i = 0; i < 2; i++) cluster.fork();
} else {
  const big = crypto.randomBytes(2e6);
  const sha = crypto.createHash('sha256').update(big).digest('hex');
  http.createServer((req, res) => {
    const h = crypto.createHash('sha256'); let n = 0;
    req.on('data', d => { h.update(d); n += d.length; });
    req.on('end', () => {
      if (req.method === 'POST') return res.end(JSON.stringify({ n, sha: h.digest('hex') }));
      res.setHeader('x-sha', sha);
      res.end(big);
    });
  }).listen(+process.argv[2], '127.0.0.1');
}
JS
    cat >"$work/client.js" <<'JS'
const http = require('http'), crypto = require('crypto');
const port = +process.argv[2], count = +process.argv[3];
const sha = b => crypto.createHash('sha256').update(b).digest('hex');
function req(method, body) {
  return new Promise((ok, ko) => {
    const r = http.request({ host: '127.0.0.1', port, method, path: '/', agent: false }, res => {
      const parts = []; res.on('data', d => parts.push(d));
      res.on('end', () => ok({ headers: res.headers, body: Buffer.concat(parts) }));
    });
    r.setTimeout(10000, () => r.destroy(new Error('no answer within 10 s')));
    r.on('error', ko); r.end(body);
  });
}
(async () => {
  for (let i = 0; i < count; i++) {
    if (i % 2) {
      const up = crypto.randomBytes(3e6);
      const r = JSON.parse((await req('POST', up)).body);
      if (r.n !== up.length || r.sha !== sha(up)) throw new Error('upload ' + i + ' differs');
    } else {
      const r = await req('GET');
      if (r.body.length !== 2e6 || sha(r.body) !== r.headers['x-sha'])
        throw new Error('download ' + i + ' differs');
    }
  }
  console.log(count + ' requests');
})().catch(e => { console.error(e.message); process.exit(1); });
JS
    bg node "$work/server.js" "$port" >"$work/node.out" 2>&1
    wait_listen "$port"
    primary=$(ss -ltnpH "sport = :$port" | grep -o 'pid=[0-9]*' | head -1 | cut -d= -f2)
    [ -n "$primary" ] || fail "no pid listens on $port"
    sleep 1  # the workers are up
    for round in 1 2; do
      "${pre[@]}" timeout 60 node "$work/client.js" "$port" 8 >"$work/client.out" 2>&1 ||
        fail "node client, round $round: $(cat "$work/client.out")"
      sleep 0.5
      fds[$round]=$(for w in $(pgrep -P "$primary"); do ls "/proc/$w/fd"; done | wc -l)
    done
    expect_shm 16 16
    [ "$(count "\[$primary node\]: accept")" = 0 ] ||
      fail "the primary settled connections it handed on: $(grep "\[$primary node\]" "$log")"
    # Every connection's descriptors went with it: the second round left
    # what the first did.
    [ "${fds[2]}" -le $((fds[1] + 2)) ] || fail "worker descriptors grew: ${fds[1]} then ${fds[2]}"
    # Idle once the clients are done: no loop on a closed connection's events.
    ticks() { for p in "$primary" $(pgrep -P "$primary"); do cut -d' ' -f14,15 "/proc/$p/stat"; done |
      awk '{t += $1 + $2} END {print t}'; }
    t0=$(ticks); sleep 1; t1=$(ticks)
    [ $((t1 - t0)) -le 20 ] || fail "server busy while idle: $((t1 - t0)) ticks in 1 s"
    echo "OK node-cluster: 16 requests (2-3 MB each) through 2 workers over 16 shm connections"
    ;;
  node-destroy)
    need node
    port=$(free_port)
    head -c 30000 /dev/urandom >"$work/file"
    cat >"$work/server.js" <<'JS'
const net = require('net'), fs = require('fs'), crypto = require('crypto');
const [port, file] = [+process.argv[2], process.argv[3]];
const sha = b => crypto.createHash('sha256').update(b).digest('hex');
const want = sha(fs.readFileSync(file));
net.createServer(s => {
  s.once('data', () => s.write('answer\n', () => {
    s.destroy();
    setTimeout(() => {
      const fd = fs.openSync(file, 'r'), buf = Buffer.alloc(65536);
      const n = fs.readSync(fd, buf, 0, buf.length, null);
      fs.closeSync(fd);
      console.log(`fd ${fd}: ${sha(buf.subarray(0, n)) === want ? 'same' : 'DIFFERENT'}`);
    }, 50);
  }));
}).listen(port, '127.0.0.1');
JS
    bg node "$work/server.js" "$port" "$work/file" >"$work/node.out" 2>&1
    wait_listen "$port"
    for i in 1 2 3 4 5; do
      got=$("${pre[@]}" timeout 20 python3 "$here/ask.py" "$port" question) ||
        fail "client $i: no answer or no end"
      [ "$got" = answer ] || fail "client $i: answer '$got'"
      sleep 0.2
    done
    sleep 0.3
    [ "$(grep -c ': same' "$work/node.out")" = 5 ] || fail "server's file reads: $(cat "$work/node.out")"
    expect_shm 5 5
    echo "OK node-destroy: 5 connections ended by the server, its file reads intact"
    ;;
  node-handoff)
    need node
    port=$(free_port)
    cat >"$work/parent.js" <<'JS'
const { fork } = require('child_process'), net = require('net');
const child = fork(__dirname + '/child.js');
let n = 0;
net.createServer(s => {
  s.once('data', d => {
    s.pause();
    child.send({ first: d.toString() }, s, { keepOpen: false });
    if (++n === 5) setTimeout(() => {
      const u = process.cpuUsage();
      setTimeout(() => {
        const v = process.cpuUsage(u);
        console.log(`idle cpu ${Math.round((v.user + v.system) / 1000)} ms`);
        child.kill(); process.exit(0);
      }, 1000);
    }, 1000);
  });
}).listen(+process.argv[2], '127.0.0.1');
JS
    cat >"$work/child.js" <<'JS'
process.on('message', (m, s) => s.end('got ' + m.first.trim() + ' from ' + process.pid + '\n'));
JS
    "${pre[@]}" timeout 60 node "$work/parent.js" "$port" >"$work/node.out" 2>&1 & srv=$!; pids+=($srv)
    wait_listen "$port"
    for i in 1 2 3 4 5; do
      got=$("${pre[@]}" timeout 20 python3 "$here/ask.py" "$port" "hello $i") || fail "client $i"
      [[ "$got" == "got hello $i from "* ]] || fail "client $i: answer '$got'"
    done
    wait "$srv" || fail "server: $(cat "$work/node.out")"
    ms=$(sed -n 's/^idle cpu \([0-9]*\) ms$/\1/p' "$work/node.out")
    [ -n "$ms" ] && [ "$ms" -le 200 ] || fail "the parent was busy while idle: $(cat "$work/node.out")"
    [ "$(count 'inherited fd=[0-9]+ .*path=relay owner=[0-9]+')" = 5 ] ||
      fail "expected 5 connections relayed to the child"
    expect_shm 5 5
    echo "OK node-handoff: 5 connections handed to a child after a first read, parent idle (${ms} ms in 1 s)"
    ;;
  redis-replica)
    need redis-server; need redis-cli
    master=$(free_port) replica=$(free_port)
    mkdir "$work/m" "$work/r"
    common=(--save "" --appendonly no --daemonize no --bind 127.0.0.1 --protected-mode no)
    bg redis-server --port "$master" --dir "$work/m" "${common[@]}" \
      --repl-diskless-sync yes --repl-diskless-sync-delay 0 >"$work/m.out" 2>&1
    wait_listen "$master"
    python3 -c '
for i in range(100000): print(f"SET k{i} {i * 7919 % 1000003}-" + "v" * 80)' |
      "${pre[@]}" timeout 30 redis-cli -p "$master" --pipe >"$work/pipe.out" 2>&1 ||
      fail "filling the master: $(cat "$work/pipe.out")"
    bg redis-server --port "$replica" --dir "$work/r" "${common[@]}" \
      --replicaof 127.0.0.1 "$master" >"$work/r.out" 2>&1
    wait_listen "$replica"
    rcli() { "${pre[@]}" timeout 10 redis-cli "$@"; }
    for _ in $(seq 200); do
      rcli -p "$replica" info replication | grep -q 'master_link_status:up' && break
      sleep 0.1
    done
    rcli -p "$replica" info replication | grep -q 'master_link_status:up' ||
      fail "the replica never synced: $(tail -n 5 "$work/r.out")"
    [ "$(rcli -p "$replica" dbsize)" = 100000 ] || fail "replica holds $(rcli -p "$replica" dbsize) keys"
    for k in k0 k4242 k99999; do
      [ "$(rcli -p "$replica" get $k)" = "$(rcli -p "$master" get $k)" ] || fail "key $k differs"
    done
    rcli -p "$master" set after-sync yes >/dev/null
    for _ in $(seq 100); do [ "$(rcli -p "$replica" get after-sync)" = yes ] && break; sleep 0.05; done
    [ "$(rcli -p "$replica" get after-sync)" = yes ] || fail "a write after the sync did not replicate"
    grep -q "Diskless rdb transfer" "$work/m.out" || fail "no diskless transfer: $(tail -n 5 "$work/m.out")"
    # The replica's link to its master, and every redis-cli, on shm.
    [ "$(count 'connect fd=[0-9]+ local=127.0.0.1:[0-9]+ peer=127.0.0.1:'"$master"' path=shm')" -ge 2 ] ||
      fail "the replica's link is not on shm"
    [ "$(count 'path=kernel|path=none')" = 0 ] ||
      fail "connections off the fast path: $(grep -E 'path=kernel|path=none' "$log")"
    echo "OK redis-replica: 100,000 keys by diskless sync, then live replication, on shm"
    ;;
  python-http)
    mkdir "$work/www"
    head -c 20000000 /dev/urandom >"$work/www/file.bin"
    port=$(free_port)
    bg python3 -m http.server --bind 127.0.0.1 --directory "$work/www" "$port" >"$work/http.out" 2>&1
    wait_listen "$port"
    "${pre[@]}" timeout 30 python3 - "$port" "$(sha "$work/www/file.bin")" <<'PY' || fail "urllib client"
import hashlib, sys, urllib.request
for i in range(3):
    data = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/file.bin", timeout=20).read()
    if hashlib.sha256(data).hexdigest() != sys.argv[2]: sys.exit(f"download {i} differs")
PY
    expect_shm 3 3
    echo "OK python-http: 3 x 20 MB from http.server to urllib over 3 shm connections"
    ;;
  mosquitto)
    need mosquitto; need mosquitto_pub; need mosquitto_sub
    port=$(free_port)
    printf 'user root\nlistener %s 127.0.0.1\nallow_anonymous true\npersistence false\nlog_dest file %s\nlog_type all\n' \
      "$port" "$work/mosq.log" >"$work/mosq.conf"
    bg mosquitto -c "$work/mosq.conf" >"$work/mosq.out" 2>&1
    wait_listen "$port"
    python3 -c 'import base64,os
for i in range(2000): print(i, base64.b64encode(os.urandom(1 + i % 700)).decode())' >"$work/msgs"
    "${pre[@]}" timeout 30 mosquitto_sub -h 127.0.0.1 -p "$port" -q 1 -t compat/t -C 2000 >"$work/got" 2>"$work/sub.err" &
    sub=$!; pids+=($sub)
    for _ in $(seq 200); do grep -q "Sending SUBACK" "$work/mosq.log" 2>/dev/null && break; sleep 0.05; done
    grep -q "Sending SUBACK" "$work/mosq.log" || fail "mosquitto_sub did not subscribe: $(cat "$work/sub.err")"
    "${pre[@]}" timeout 30 mosquitto_pub -h 127.0.0.1 -p "$port" -q 1 -t compat/t -l <"$work/msgs" ||
      fail "mosquitto_pub"
    wait "$sub" || fail "mosquitto_sub: $(cat "$work/sub.err")"
    cmp -s "$work/msgs" "$work/got" || fail "received messages differ ($(wc -l <"$work/got") lines)"
    expect_shm 2 2
    echo "OK mosquitto: 2000 QoS 1 messages in order over 2 shm connections"
    ;;
  lighttpd)
    need lighttpd; need ab; need curl
    mkdir -p "$work/www"
    head -c 20000000 /dev/urandom >"$work/www/file.bin"
    head -c 600 /dev/urandom >"$work/www/small.bin"
    port=$(free_port)
    cat >"$work/lighttpd.conf" <<CFG
server.document-root = "$work/www"
server.bind = "127.0.0.1"
server.port = $port
server.errorlog = "$work/lighttpd.err"
server.max-keep-alive-requests = 10000
CFG
    bg lighttpd -D -f "$work/lighttpd.conf" >"$work/lighttpd.out" 2>&1
    wait_listen "$port"
    "${pre[@]}" timeout 30 curl -sS -o "$work/got" "http://127.0.0.1:$port/file.bin" || fail "curl"
    cmp -s "$work/www/file.bin" "$work/got" || fail "download differs"
    "${pre[@]}" timeout 30 ab -q -k -n 4000 -c 8 "http://127.0.0.1:$port/small.bin" >"$work/ab.out" 2>&1 ||
      fail "ab: $(cat "$work/ab.out")"
    grep -qE "^Complete requests: +4000$" "$work/ab.out" && grep -qE "^Failed requests: +0$" "$work/ab.out" &&
      ! grep -q "Non-2xx" "$work/ab.out" && grep -qE "^Total transferred: .*" "$work/ab.out" ||
      fail "ab: $(cat "$work/ab.out")"
    # 600 bytes of body per response
    grep -qE "^HTML transferred: +2400000 bytes$" "$work/ab.out" || fail "ab: $(grep transferred "$work/ab.out")"
    expect_shm 9 9
    echo "OK lighttpd: 20 MB to curl, 4000 keep-alive requests from ab (2.4 MB of bodies), 9 shm connections"
    ;;
  mariadb)
    [ -x /usr/sbin/mariadbd ] || fail "mariadb-server is not installed (scripts/deps.sh installs it)"
    need mariadb-install-db; need mariadb; need sysbench
    mariadb-install-db --user="$(id -un)" --datadir="$work/data" --auth-root-authentication-method=normal \
      --skip-test-db >"$work/install.out" 2>&1 || fail "mariadb-install-db: $(tail -n 5 "$work/install.out")"
    port=$(free_port)
    bg /usr/sbin/mariadbd --no-defaults --user="$(id -un)" --datadir="$work/data" --socket="$work/sock" \
      --pid-file="$work/pid" --bind-address=127.0.0.1 --port="$port" --skip-log-bin \
      --innodb-buffer-pool-size=64M --innodb-flush-log-at-trx-commit=0 >"$work/server.out" 2>&1
    wait_listen "$port"
    sql() { "${pre[@]}" timeout 30 mariadb -h 127.0.0.1 -P "$port" -u root -N -B "$@"; }
    # 300 kB of random bytes into a blob and back: the server's digest of
    # what it received, then the bytes it sends back, compared.
    head -c 300000 /dev/urandom >"$work/blob"
    { echo "create database compat; create table compat.t (b longblob);"
      printf "insert into compat.t values (unhex('%s'));\n" "$(od -An -v -tx1 "$work/blob" | tr -d ' \n')"; } |
      sql || fail "insert"
    got=$(sql -e "select sha2(b, 256), length(b) from compat.t") || fail "select"
    [ "$got" = "$(sha "$work/blob")	300000" ] || fail "the server stored $got"
    sql -e "select hex(b) from compat.t" >"$work/hex" || fail "select hex"
    [ "$(tr -d '\n' <"$work/hex" | tr 'A-F' 'a-f')" = "$(od -An -v -tx1 "$work/blob" | tr -d ' \n')" ] ||
      fail "the blob read back differs"
    sb=(sysbench --db-driver=mysql --mysql-host=127.0.0.1 --mysql-port="$port" --mysql-user=root
        --mysql-db=compat --tables=2 --table-size=2000)
    "${pre[@]}" timeout 60 "${sb[@]}" oltp_read_write prepare >"$work/prep.out" 2>&1 ||
      fail "sysbench prepare: $(tail -n 5 "$work/prep.out")"
    "${pre[@]}" timeout 60 "${sb[@]}" --threads=4 --events=1000 --time=0 oltp_read_write run \
      >"$work/run.out" 2>&1 || fail "sysbench run: $(tail -n 5 "$work/run.out")"
    # (ignored errors are deadlocks between the threads, which sysbench retries)
    grep -qE "^ +transactions: +1000 " "$work/run.out" && grep -qE "^ +reconnects: +0 " "$work/run.out" ||
      fail "sysbench: $(cat "$work/run.out")"
    # each transaction deletes a row and inserts it again: 2000 rows per table
    rows=$(sql -e "select (select count(*) from compat.sbtest1), (select count(*) from compat.sbtest2)") ||
      fail "count"
    [ "$rows" = "2000	2000" ] || fail "sysbench tables hold $rows rows"
    # 4 mariadb clients, sysbench prepare + 4 threads; each accepted by mariadbd
    [ "$(count "mariadbd\]: accept fd=.*path=shm")" = 9 ] || fail "mariadbd did not accept 9 on shm"
    expect_shm 9 9
    echo "OK mariadb: a 300 kB blob both ways, sysbench oltp_read_write 1000 transactions, 9 shm connections"
    ;;
  rsyncd)
    # rsync's daemon forks per connection; its client forks a receiver that
    # waits (poll) on its copy of the connection before it reads, while the
    # parent writes: the child's first use is that wait.
    need rsync
    mkdir -p "$work/mod/tree" "$work/pulled" "$work/up"
    head -c 5000000 /dev/urandom >"$work/mod/big"
    for i in $(seq 200); do head -c $((i * 97)) /dev/urandom >"$work/mod/tree/f$i"; done
    head -c 3000000 /dev/urandom >"$work/up/g"
    printf 'use chroot = no\nuid = %s\ngid = %s\n[m]\npath = %s\nread only = no\n' \
      "$(id -u)" "$(id -g)" "$work/mod" >"$work/rsyncd.conf"
    port=$(free_port)
    bg rsync --daemon --no-detach --address=127.0.0.1 --port="$port" --config="$work/rsyncd.conf"
    wait_listen "$port"
    "${pre[@]}" timeout 30 rsync -a "rsync://127.0.0.1:$port/m/" "$work/pulled/" || fail "rsync pull"
    diff -r "$work/mod" "$work/pulled" >/dev/null || fail "the pulled tree differs"
    "${pre[@]}" timeout 30 rsync -a "$work/up/" "rsync://127.0.0.1:$port/m/up/" || fail "rsync push"
    cmp -s "$work/up/g" "$work/mod/up/g" || fail "the pushed file differs"
    expect_shm 2 2
    echo "OK rsyncd: a 202-file tree pulled, a file pushed, 2 shm connections"
    ;;
  git-daemon)
    # git daemon execs upload-pack or receive-pack per connection; git push
    # forks and execs pack-objects, which only writes the pack to its copy
    # of the connection while the parent reads the server's status from it.
    need git
    export GIT_CONFIG_NOSYSTEM=1 HOME=$work
    git config --global user.email t@example.org
    git config --global user.name t
    git config --global init.defaultBranch main
    mkdir -p "$work/repos" "$work/src"
    git init -q --bare "$work/repos/r.git"
    (cd "$work/src" && git init -q && head -c 3000000 /dev/urandom >blob && git add blob &&
      git commit -qm one && git push -q "$work/repos/r.git" HEAD:refs/heads/main)
    port=$(free_port)
    bg git daemon --reuseaddr --base-path="$work/repos" --export-all --enable=receive-pack \
      --listen=127.0.0.1 --port="$port" "$work/repos"
    wait_listen "$port"
    "${pre[@]}" timeout 30 git clone -q -b main "git://127.0.0.1:$port/r.git" "$work/clone" ||
      fail "git clone"
    cmp -s "$work/src/blob" "$work/clone/blob" || fail "the cloned file differs"
    (cd "$work/clone" && head -c 1000000 /dev/urandom >b2 && git add b2 && git commit -qm two &&
      "${pre[@]}" timeout 30 git push -q origin HEAD:refs/heads/other) || fail "git push"
    "${pre[@]}" timeout 30 git clone -q -b other "git://127.0.0.1:$port/r.git" "$work/clone2" ||
      fail "git clone of the pushed branch"
    cmp -s "$work/clone/b2" "$work/clone2/b2" || fail "the pushed file differs"
    [ "$(git -C "$work/repos/r.git" rev-parse other)" = "$(git -C "$work/clone" rev-parse HEAD)" ] ||
      fail "the pushed branch is not the client's commit"
    expect_shm 3 3
    echo "OK git-daemon: clone, push, clone of the push, 3 shm connections"
    ;;
  socat-stdio)
    # socat hands each connection to sha256sum as its stdin and stdout
    # (EXEC ... nofork); sha256sum reads it through stdio, where the library
    # sees no use: each client must be told at once (no budget waited), the
    # connection stays on kernel TCP, and every digest is right.
    need socat
    head -c 4000000 /dev/urandom >"$work/up"
    port=$(free_port)
    bg socat "TCP-LISTEN:$port,bind=127.0.0.1,reuseaddr,fork" EXEC:sha256sum,nofork
    wait_listen "$port"
    three_digests_told "the peer reads the connection outside the library"
    echo "OK socat-stdio: 3 connections read through stdio, no client waited"
    ;;
  socket-activate)
    # systemd-socket-activate accepts, forks and execs its service with a
    # fresh environment (no LD_PRELOAD): each client must learn at once that
    # the program serving it is not preloaded and stay on kernel TCP.
    need systemd-socket-activate
    head -c 4000000 /dev/urandom >"$work/up"
    port=$(free_port)
    bg systemd-socket-activate --inetd -a -l "127.0.0.1:$port" sha256sum
    wait_listen "$port"
    three_digests_told "the peer passes the connection to a program that is not preloaded"
    echo "OK socket-activate: 3 connections to a service without the library, no client waited"
    ;;
  *) fail "unknown case" ;;
esac

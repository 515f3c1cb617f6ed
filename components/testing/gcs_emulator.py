"""A local GCS server for tests: `gcp-storage-emulator` as a real process.

    emulator = GcsEmulator(port)   # starts the server, waits until it answers
    emulator.create_bucket('b')    # through google-cloud-storage
    ...                            # gs://b/... works in TF, Beam and TFX
    with emulator.reachable_at(a) as env:  # also at address `a` (the test
      ...                          # hosts' bridge), for processes with `env`
    emulator.stop()                # kills it by pid

`GcsEmulator(port, object_store=True)` answers object reads as a store's
front end does, many connections in parallel (the emulator serves one request
at a time): an object read whole once is answered by the front from then on.
`emulator.throttle(first_byte_s=0.05, stream_bytes_per_s=4e6)` then holds
each answer back as object storage off this machine does: its first byte that
long after the request, then at most that rate on its connection (the
benchmark of the trainer's read-ahead, benchmarks/bench_remote_read.py).

Every process that touches gs:// needs `environment(port)` in its environment
before it imports TensorFlow. Clients reach the server like this:

- Beam's gcsio and google-cloud-storage (Python): `STORAGE_EMULATOR_HOST`,
  plain HTTP to the port.
- TensorFlow: its built-in GCS filesystem, the one that production uses. It
  only talks to https://www.googleapis.com and https://storage.googleapis.com,
  so the port is also an HTTPS proxy (`https_proxy`): a CONNECT to a
  *.googleapis.com host is answered with TLS under a test CA
  (`CURL_CA_BUNDLE`), and the requests inside go to the emulator.
  `GOOGLE_AUTH_TOKEN_FOR_TESTING` spares TF the credential lookup.

Why not TF's modular GCS plugin (tensorflow-io-gcs-filesystem 0.37.1, which
honours `CLOUD_STORAGE_EMULATOR_ENDPOINT`)? Measured here, it is not the
filesystem production runs and it differs where TFX needs it: its RenameFile
renames a directory as if it were one object, so tf.Transform's
`tf.io.gfile.rename(<dir>, <dir>)` (WriteTransformFn) fails with "Permanent
error in RewriteObject: [NOT_FOUND]"; and its google-cloud-cpp 1.21.0 / libcurl
8.4.0 client corrupts its heap (segfault in libcurl's chop_write) when a
download of more than ~150 KB is already waiting in the socket, which is what a
local server sends.

The emulator keeps everything in memory (`--in-memory`): its on-disk mode
clashes with the empty "folder/" objects TensorFlow writes for directories. It
serves one request at a time (its storage is not thread-safe); the front that
listens on the port relays every connection to it. Where TensorFlow's client
and gcp-storage-emulator 2026.7.19 disagree, `serve` adapts the emulator to
what GCS does: a body sent with both Transfer-Encoding: chunked and
Content-Length is read as chunked (it stored the chunk framing), an empty media
upload is an empty object (it failed with a 500, retried forever), upload
session URLs handed out inside a tunnel are https, a bucket's
`storageLayout` is answered (TensorFlow 2.21 asks it before renaming a
directory), and the front answers `Expect: 100-continue` (curl otherwise waits
1 s before every upload).
"""

import argparse
import contextlib
import datetime
import http
import json
import os
import re
import select
import signal
import socket
import socketserver
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from typing import Dict, Iterator, Optional, Set

HOST = '127.0.0.1'
PROJECT = 'tfx-hpm-test'
START_TIMEOUT_S = 30.0
# Where an object-store front takes its throttle (`GcsEmulator.throttle`).
THROTTLE_PATH = b'/_front/throttle'
# Hosts TensorFlow's GCS filesystem sends requests to.
GOOGLE_API_SUFFIX = '.googleapis.com'
# Nothing listens on the discard port: a metadata-server probe that gets
# past NO_GCE_CHECK is refused at once instead of waiting on the network.
_DEAD_METADATA = f'{HOST}:9'
_PLACEHOLDER_CREDENTIALS = {
    'type': 'authorized_user',
    'client_id': 'tfx-hpm-gcs-emulator',
    'client_secret': 'unused',
    'refresh_token': 'unused',
    'token': 'gcs-emulator-placeholder-token',
    'expiry': '2999-01-01T00:00:00Z',
}


def endpoint(port: int, host: str = HOST) -> str:
  return f'http://{host}:{port}'


def environment(port: int, host: str = HOST) -> Dict[str, str]:
  """Everything TF, Beam and google-cloud-* need to use the emulator at `port`
  of `host` (another than HOST: where `GcsEmulator.reachable_at` relays).

  Local files are unaffected; gs:// goes to the emulator (and fails fast
  while none runs). Connections to localhost and 127.0.0.1 (TF cluster gRPC,
  the emulator itself) bypass the proxy.
  """
  url = endpoint(port, host)
  no_proxy = 'localhost,127.0.0.1,::1'
  return {
      # --- TensorFlow's built-in GCS filesystem (not the modular plugin).
      'TF_USE_MODULAR_FILESYSTEM': '0',
      'https_proxy': url,
      'HTTPS_PROXY': url,
      'no_proxy': no_proxy,
      'NO_PROXY': no_proxy,
      'CURL_CA_BUNDLE': tls_files()['ca'],
      'GOOGLE_AUTH_TOKEN_FOR_TESTING': 'gcs-emulator-placeholder-token',
      # Several processes (trainer workers, the executor, the test) read what
      # the others just wrote: no stat, listing or block caches.
      'GCS_STAT_CACHE_MAX_AGE': '0',
      'GCS_MATCHING_PATHS_CACHE_MAX_AGE': '0',
      'GCS_READ_CACHE_MAX_SIZE_MB': '0',
      # --- Beam's gcsio and google-cloud-storage (Python).
      'STORAGE_EMULATOR_HOST': url,
      'GOOGLE_CLOUD_PROJECT': PROJECT,
      # Credentials. Beam asks google-auth's default() and retries every
      # failure with backoff (4 retries from 2 s: ~21 s in each process that
      # opens gs://) before it connects anonymously. A static user token that
      # never expires answers at once and is never refreshed; the emulator
      # ignores it. (A missing file fails fast but is retried just the same.)
      'GOOGLE_APPLICATION_CREDENTIALS': credentials_file(),
      # Any metadata-server probe stays on loopback and fails fast.
      'NO_GCE_CHECK': 'True',
      'GCE_METADATA_HOST': _DEAD_METADATA,
      'GCE_METADATA_IP': _DEAD_METADATA,
  }


def _state_dir() -> str:
  path = os.path.join(tempfile.gettempdir(),
                      f'tfx-hpm-gcs-emulator-{os.getuid()}')
  os.makedirs(path, exist_ok=True)
  return path


def credentials_file() -> str:
  """A placeholder Application Default Credentials file (written once).

  An `authorized_user` token with an expiry far in the future: google-auth
  treats it as valid and never contacts a token endpoint, so nothing reaches
  the network. Any real Google API would refuse it.
  """
  path = os.path.join(_state_dir(), 'adc.json')
  content = json.dumps(_PLACEHOLDER_CREDENTIALS, sort_keys=True)
  try:
    with open(path) as f:
      if f.read() == content:
        return path
  except OSError:
    pass
  fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix='.json')
  with os.fdopen(fd, 'w') as f:
    f.write(content)
  os.replace(tmp, path)
  return path


def tls_files() -> Dict[str, str]:
  """A test CA and a *.googleapis.com certificate it signed (made once)."""
  final = os.path.join(_state_dir(), 'tls')
  files = {name: os.path.join(final, f'{name}.pem')
           for name in ('ca', 'cert', 'key')}
  if all(os.path.exists(p) for p in files.values()):
    return files
  # Written to a fresh folder, then renamed into place: concurrent sessions
  # never see half a set.
  staging = tempfile.mkdtemp(dir=_state_dir(), prefix='tls-')
  for name, pem in _make_certificates().items():
    with open(os.path.join(staging, f'{name}.pem'), 'wb') as f:
      f.write(pem)
  try:
    os.rename(staging, final)
  except OSError:  # Another process made them first.
    for name in files:
      os.remove(os.path.join(staging, f'{name}.pem'))
    os.rmdir(staging)
  return files


def _make_certificates() -> Dict[str, bytes]:
  # pylint: disable=g-import-not-at-top
  from cryptography import x509
  from cryptography.hazmat.primitives import hashes
  from cryptography.hazmat.primitives import serialization
  from cryptography.hazmat.primitives.asymmetric import ec
  from cryptography.x509.oid import ExtendedKeyUsageOID
  from cryptography.x509.oid import NameOID
  # pylint: enable=g-import-not-at-top
  now = datetime.datetime.now(datetime.timezone.utc)
  start, end = now - datetime.timedelta(days=1), now + datetime.timedelta(
      days=3650)
  ca_key = ec.generate_private_key(ec.SECP256R1())
  ca_name = x509.Name(
      [x509.NameAttribute(NameOID.COMMON_NAME, 'tfx-hpm GCS emulator CA')])
  ca = (x509.CertificateBuilder()
        .subject_name(ca_name).issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start).not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0),
                       critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=True, key_cert_sign=True, crl_sign=True,
            content_commitment=False, key_encipherment=False,
            data_encipherment=False, key_agreement=False,
            encipher_only=False, decipher_only=False), critical=True)
        .sign(ca_key, hashes.SHA256()))
  key = ec.generate_private_key(ec.SECP256R1())
  names = ['www.googleapis.com', 'storage.googleapis.com', '*.googleapis.com']
  cert = (x509.CertificateBuilder()
          .subject_name(x509.Name(
              [x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
          .issuer_name(ca_name)
          .public_key(key.public_key())
          .serial_number(x509.random_serial_number())
          .not_valid_before(start).not_valid_after(end)
          .add_extension(x509.SubjectAlternativeName(
              [x509.DNSName(n) for n in names]), critical=False)
          .add_extension(x509.BasicConstraints(ca=False, path_length=None),
                         critical=True)
          .add_extension(x509.ExtendedKeyUsage(
              [ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
          .sign(ca_key, hashes.SHA256()))
  return {
      'ca': ca.public_bytes(serialization.Encoding.PEM),
      'cert': cert.public_bytes(serialization.Encoding.PEM),
      'key': key.private_bytes(serialization.Encoding.PEM,
                               serialization.PrivateFormat.PKCS8,
                               serialization.NoEncryption()),
  }


def throttle(port: int, first_byte_s: float,
             stream_bytes_per_s: float) -> None:
  """Holds back every answer of the `object_store` front on `port` from now
  on: its first byte `first_byte_s` after the request, then at most
  `stream_bytes_per_s` on its connection (0: no cap)."""
  body = json.dumps({'first_byte_s': first_byte_s,
                     'stream_bytes_per_s': stream_bytes_per_s}).encode()
  with socket.create_connection((HOST, port), timeout=10) as sock:
    sock.sendall(b'PUT %s HTTP/1.0\r\nContent-Length: %d\r\n\r\n' % (
        THROTTLE_PATH, len(body)) + body)
    answer = sock.recv(1024)
  if not answer.startswith(b'HTTP/1.0 200'):
    raise RuntimeError(f'The front refused the throttle: {answer!r}')


def is_answering(port: int, timeout: float = 1.0, host: str = HOST) -> bool:
  """True once the server answers its health check."""
  # No proxy: the server is on this machine.
  opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
  try:
    with opener.open(endpoint(port, host) + '/', timeout=timeout) as r:
      return r.status == 200
  except (urllib.error.URLError, OSError):
    return False


class GcsEmulator:
  """The emulator as a child process, on `port` of 127.0.0.1."""

  def __init__(self, port: int, log_dir: Optional[str] = None,
               cpus: Optional[Set[int]] = None, object_store: bool = False):
    """`cpus`: the cores the server runs on (all by default), so that a
    benchmark can keep it off the cores it measures on."""
    self.port = port
    self.url = endpoint(port)
    self._log_dir = log_dir or tempfile.mkdtemp(prefix='gcs_emulator_')
    self.log_path = os.path.join(self._log_dir, 'gcs_emulator.log')
    self._log = open(self.log_path, 'wb')  # pylint: disable=consider-using-with
    tls = tls_files()
    argv = [sys.executable, os.path.abspath(__file__), '--host', HOST,
            '--port', str(port), '--cert', tls['cert'], '--key', tls['key'],
            '--parent-pid', str(os.getpid()),
            *(['--object-store'] if object_store else [])]
    start = time.monotonic()
    self.process = subprocess.Popen(  # pylint: disable=consider-using-with
        argv, stdin=subprocess.DEVNULL, stdout=self._log,
        stderr=subprocess.STDOUT, start_new_session=True,
        preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
    try:
      self._wait_until_answering()
    except BaseException:
      self.stop()
      raise
    self.startup_s = time.monotonic() - start

  def _wait_until_answering(self) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
      if self.process.poll() is not None:
        raise RuntimeError(
            f'gcp-storage-emulator exited ({self.process.returncode}) on '
            f'port {self.port}:\n{self.log_tail()}')
      if is_answering(self.port, timeout=0.5):
        return
      time.sleep(0.05)
    raise RuntimeError(
        f'gcp-storage-emulator did not answer on {self.url} within '
        f'{START_TIMEOUT_S:.0f} s:\n{self.log_tail()}')

  def throttle(self, first_byte_s: float, stream_bytes_per_s: float) -> None:
    throttle(self.port, first_byte_s, stream_bytes_per_s)

  def client(self):
    """A google-cloud-storage client of the emulator (anonymous)."""
    # pylint: disable-next=g-import-not-at-top
    from google.auth import credentials as auth_credentials
    from google.cloud import storage  # pylint: disable=g-import-not-at-top
    return storage.Client(
        project=PROJECT, credentials=auth_credentials.AnonymousCredentials(),
        client_options={'api_endpoint': self.url})

  def create_bucket(self, name: str) -> str:
    """Creates `name` through the JSON API; returns 'gs://<name>'."""
    self.client().create_bucket(name)
    return f'gs://{name}'

  def log_tail(self, max_bytes: int = 20000) -> str:
    if not self._log.closed:
      self._log.flush()
    try:
      with open(self.log_path, 'rb') as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - max_bytes))
        return f.read().decode('utf-8', errors='replace')
    except OSError:
      return ''

  @contextlib.contextmanager
  def reachable_at(self, address: str) -> Iterator[Dict[str, str]]:
    """The emulator also at `address` (this machine's end of the test hosts'
    bridge, components/testing/netns_hosts.py), by a relay process, for as long
    as the context lasts; yields the environment that points there."""
    relay = subprocess.Popen(  # pylint: disable=consider-using-with
        [sys.executable, os.path.abspath(__file__), '--host', address,
         '--port', str(self.port), '--relay-to', str(self.port),
         '--parent-pid', str(os.getpid())],
        stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
        start_new_session=True)
    try:
      deadline = time.monotonic() + START_TIMEOUT_S
      while not is_answering(self.port, timeout=0.5, host=address):
        if relay.poll() is not None or time.monotonic() > deadline:
          raise RuntimeError(
              f'no GCS emulator relay on {address}:{self.port} '
              f'(exit {relay.poll()}):\n{self.log_tail()}')
        time.sleep(0.05)
      yield environment(self.port, address)
    finally:
      relay.kill()
      relay.wait(timeout=30)

  def stop(self) -> None:
    """Kills the server (its process group, by pid) and waits for it."""
    if self.process.poll() is None:
      try:
        os.killpg(self.process.pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
      self.process.wait(timeout=30)
    self._log.close()


# ----------------------------------------------------- the server process
#
# `python components/testing/gcs_emulator.py --port P --cert C --key K` (what
# GcsEmulator runs): the emulator on an internal port, behind a threaded front
# on P that relays plain HTTP and terminates CONNECT tunnels to
# *.googleapis.com.


def _readable(client, sockets, wait_s: float):
  """The sockets with bytes to read (the client's TLS layer may hold some
  that select cannot see)."""
  if isinstance(client, ssl.SSLSocket) and client.pending():
    return [client]
  return select.select(sockets, [], [], wait_s)[0]


def _receive(source) -> Optional[bytes]:
  """The next bytes of `source`: b'' once it is closed (or broken), None
  when TLS needs more before it has any."""
  try:
    return source.recv(256 * 1024)
  except ssl.SSLWantReadError:
    return None
  except OSError:
    return b''


def _pump(client, backend) -> None:
  """Copies bytes both ways until either side closes."""
  sockets = [client, backend]
  while True:
    readable = _readable(client, sockets, 600)
    if not readable:
      return
    for source in readable:
      data = _receive(source)
      if data is None:
        continue
      if not data:
        return
      (backend if source is client else client).sendall(data)


class _Pace:
  """When the bytes of one answer may go out: the first at `start`, then at
  most `bytes_per_s` (0: no cap), in pieces of at least 64 KB or 20 ms of
  the cap (fewer wake-ups of the sending thread, the same rate)."""

  def __init__(self, start: float, bytes_per_s: float):
    self.start = start
    self.bytes_per_s = bytes_per_s
    self.piece = max(64 * 1024, int(bytes_per_s * 0.02))
    self.sent = 0

  def _allowed(self, pending: int, now: float) -> int:
    if not self.bytes_per_s:
      return pending
    return min(pending, int((now - self.start) * self.bytes_per_s) -
               self.sent)

  def due(self, pending: int, now: float, complete: bool = False) -> int:
    """Of `pending` bytes, how many go now (0: none yet); `complete`: no
    more will come, so a short last piece need not wait to fill."""
    if now < self.start:
      return 0
    allowed = self._allowed(pending, now)
    if allowed >= min(self.piece, pending) or (complete and allowed > 0):
      return allowed
    return 0

  def wait_s(self, pending: int, now: float) -> float:
    """How long until the next piece of `pending` bytes may go."""
    allowed = max(self._allowed(pending, now), 0)
    return max(self.start - now,
               (min(self.piece, pending) - allowed) / self.bytes_per_s
               if self.bytes_per_s else 0.0, 0.001)


def _throttled_pump(client, backend, first_byte_s: float,
                    bytes_per_s: float) -> None:
  """`_pump`, with the answer held back as object storage holds it: its
  first byte `first_byte_s` after the request, then at most `bytes_per_s`
  on this connection (0: no cap). The answer is taken from the backend at
  once (it serves one request at a time), so connections are throttled in
  parallel, and one thread serves both directions (an SSL socket must not
  be read and written by two)."""
  answer = bytearray()
  pace = _Pace(time.monotonic() + first_byte_s, bytes_per_s)
  backend_open = True
  while True:
    now = time.monotonic()
    wait = 600.0
    if answer:
      due = pace.due(len(answer), now, complete=not backend_open)
      if due:
        client.sendall(answer[:due])
        del answer[:due]
        pace.sent += due
      if answer:
        wait = pace.wait_s(len(answer), now)
    elif not backend_open:
      return
    sockets = [client] + ([backend] if backend_open else [])
    for source in _readable(client, sockets, wait):
      data = _receive(source)
      if data is None:
        continue
      if source is backend:
        answer += data
        backend_open = bool(data)
      elif not data:
        return
      else:
        backend.sendall(data)


def _send_throttled(client, answer: bytes, start: float,
                    bytes_per_s: float) -> None:
  """Sends `answer` from time `start` on, at most `bytes_per_s` (0: no
  cap)."""
  pace = _Pace(start, bytes_per_s)
  while pace.sent < len(answer):
    now = time.monotonic()
    due = pace.due(len(answer) - pace.sent, now)
    if not due:
      time.sleep(pace.wait_s(len(answer) - pace.sent, now))
      continue
    client.sendall(answer[pace.sent:pace.sent + due])
    pace.sent += due


class _ObjectCache:
  """Objects a throttled front has read whole from the emulator, by path.

  Later reads of them are answered by the front itself (the emulator serves
  one request at a time, slower than the streams a benchmark asks for in
  parallel); any write clears it.
  """

  def __init__(self):
    self._objects: Dict[bytes, bytes] = {}
    self._lock = threading.Lock()

  def clear(self) -> None:
    with self._lock:
      self._objects.clear()

  def answer(self, path: bytes, head: bytes) -> Optional[bytes]:
    """The HTTP answer to a media GET of `path` from the cache, or None."""
    with self._lock:
      data = self._objects.get(path)
    if data is None:
      return None
    first, last = 0, len(data) - 1
    match = re.search(rb'\r\nrange:\s*bytes=(\d+)-(\d*)', head.lower())
    if match:
      first = int(match.group(1))
      last = min(last, int(match.group(2))) if match.group(2) else last
    if first >= len(data):
      return (b'HTTP/1.0 416 Requested Range Not Satisfiable\r\n'
              b'Content-Range: bytes */%d\r\nContent-Length: 0\r\n\r\n'
              % len(data))
    body = data[first:last + 1]
    return (b'HTTP/1.0 206 Partial Content\r\n'
            b'Content-Type: application/octet-stream\r\n'
            b'Content-Range: bytes %d-%d/%d\r\nContent-Length: %d\r\n\r\n'
            % (first, first + len(body) - 1, len(data), len(body)) + body)

  def keep(self, path: bytes, answer: bytes) -> None:
    """Keeps the object if `answer` holds all of it."""
    head, _, body = answer.partition(b'\r\n\r\n')
    match = re.search(rb'\r\ncontent-range:\s*bytes 0-(\d+)/(\d+)',
                      head.lower())
    if (head.startswith((b'HTTP/1.0 206', b'HTTP/1.1 206')) and match and
        int(match.group(1)) + 1 == int(match.group(2)) == len(body)):
      with self._lock:
        self._objects[path] = bytes(body)


def _is_media_read(method: str, target: str) -> bool:
  """A read of an object's bytes (`GET /<bucket>/<object>`, TF's GCS
  filesystem's download), not a JSON API or upload request."""
  return method == 'GET' and not target.startswith(
      ('/storage/', '/upload/', '/download/', 'http')) and target.count(
          '/') >= 2


def _read_all(sock) -> bytes:
  data = bytearray()
  while True:
    chunk = sock.recv(1 << 20)
    if not chunk:
      return bytes(data)
    data += chunk


def _read_head(sock) -> Optional[bytes]:
  """Bytes up to and including the end of the first request's headers."""
  data = b''
  while b'\r\n\r\n' not in data:
    chunk = sock.recv(64 * 1024)
    if not chunk or len(data) > 1 << 20:
      return None
    data += chunk
  return data


def _no_delay(sock) -> None:
  # Small request/response pieces: without this, Nagle and delayed ACKs
  # add ~40 ms to every request.
  sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class _FrontHandler(socketserver.BaseRequestHandler):
  """One client connection: a plain request, or a CONNECT tunnel.

  The emulator answers HTTP/1.0 and closes the connection after each
  response, so one connection (or tunnel) carries one request.
  """

  def handle(self):
    client = self.request
    _no_delay(client)
    data = _read_head(client)
    if data is None:
      return
    request_line = data.split(b'\r\n', 1)[0].decode('latin-1')
    method, target = (request_line.split(' ') + ['', ''])[:2]
    if (method == 'PUT' and target.encode() == THROTTLE_PATH and
        self.server.object_store):
      settings = json.loads(data.split(b'\r\n\r\n', 1)[1] or b'{}')
      self.server.first_byte_s = float(settings['first_byte_s'])
      self.server.stream_bytes_per_s = float(settings['stream_bytes_per_s'])
      client.sendall(b'HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n')
      return
    if method == 'CONNECT':
      host = target.rsplit(':', 1)[0]
      if not host.endswith(GOOGLE_API_SUFFIX):
        client.sendall(b'HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n')
        return
      client.sendall(b'HTTP/1.1 200 Connection established\r\n\r\n')
      client = self.server.tls.wrap_socket(client, server_side=True)
      data = _read_head(client)
      if data is None:
        return
      method, target = (data.split(b'\r\n', 1)[0].decode('latin-1').split(
          ' ') + ['', ''])[:2]
    head, body = data.split(b'\r\n\r\n', 1)
    lines = head.split(b'\r\n')
    kept = [line for line in lines
            if line.lower().replace(b' ', b'') != b'expect:100-continue']
    if len(kept) < len(lines):
      # curl waits a second for "100 Continue" before it sends a body; the
      # HTTP/1.0 emulator never says it.
      client.sendall(b'HTTP/1.1 100 Continue\r\n\r\n')
    throttled = self.server.object_store
    if throttled:
      if method not in ('GET', 'HEAD'):
        self.server.objects.clear()
      cached = _is_media_read(method, target) and self.server.objects.answer(
          target.encode(), head)
      if cached:
        _send_throttled(client, cached,
                        time.monotonic() + self.server.first_byte_s,
                        self.server.stream_bytes_per_s)
        return
    backend = socket.create_connection((HOST, self.server.backend_port))
    _no_delay(backend)
    try:
      backend.sendall(b'\r\n'.join(kept) + b'\r\n\r\n' + body)
      if throttled and _is_media_read(method, target):
        start = time.monotonic() + self.server.first_byte_s
        answer = _read_all(backend)
        self.server.objects.keep(target.encode(), answer)
        _send_throttled(client, answer, start,
                        self.server.stream_bytes_per_s)
      elif throttled:
        _throttled_pump(client, backend, self.server.first_byte_s,
                        self.server.stream_bytes_per_s)
      else:
        _pump(client, backend)
    finally:
      backend.close()
      if isinstance(client, ssl.SSLSocket):
        try:
          client.unwrap()
        except (OSError, ValueError):
          pass


class _Front(socketserver.ThreadingTCPServer):
  daemon_threads = True
  allow_reuse_address = True
  request_queue_size = 128


class _RelayHandler(socketserver.BaseRequestHandler):
  """One connection, relayed as bytes to the front on HOST."""

  def handle(self):
    _no_delay(self.request)
    backend = socket.create_connection((HOST, self.server.target_port))
    _no_delay(backend)
    try:
      _pump(self.request, backend)
    finally:
      backend.close()


def relay(host: str, port: int, target_port: int, parent_pid: int) -> None:
  """Relays connections to `host`:`port` to the front on HOST:`target_port`
  (GcsEmulator.reachable_at)."""
  server = _Front((host, port), _RelayHandler)
  server.target_port = target_port
  threading.Thread(target=server.serve_forever, daemon=True).start()
  if parent_pid:
    threading.Thread(target=_exit_with_parent, args=(parent_pid,),
                     daemon=True).start()
  signal.sigwait({signal.SIGTERM, signal.SIGINT})


def serve(host: str, port: int, cert: str, key: str,
          parent_pid: int = 0, object_store: bool = False) -> None:
  """Runs gcp-storage-emulator (in memory) behind the relaying front.

  Stops on SIGTERM / SIGINT, or when `parent_pid` (the test process) is gone:
  a killed test session leaves no server behind.
  """
  # pylint: disable=g-import-not-at-top
  import logging
  from gcp_storage_emulator import server as emulator_server
  # pylint: enable=g-import-not-at-top
  logging.basicConfig(level=logging.INFO,
                      format='%(asctime)s %(levelname)s %(message)s')

  original_init = emulator_server.Request.__init__

  def request_init(self, request_handler, method):
    original_init(self, request_handler, method)
    # Requests from a TLS tunnel carry Host: www.googleapis.com; the URLs
    # the emulator hands out (resumable upload sessions) must go back
    # through the tunnel, so over https.
    request_host = request_handler.headers.get('Host', '')
    if request_host.split(':')[0].endswith(GOOGLE_API_SUFFIX):
      self._base_url = f'https://{request_host}'  # pylint: disable=protected-access
      self._full_url = self._base_url + request_handler.path  # pylint: disable=protected-access

  emulator_server.Request.__init__ = request_init

  original_read_raw_data = emulator_server._read_raw_data  # pylint: disable=protected-access

  def read_raw_data(request_handler):
    # RFC 9112 6.3: Transfer-Encoding wins over Content-Length. TensorFlow
    # sends both on its chunked upload PUTs; the emulator reads
    # Content-Length first and stores the chunk framing.
    headers = request_handler.headers
    if (headers.get('Transfer-Encoding', '').lower() == 'chunked' and
        'Content-Length' in headers):
      del headers['Content-Length']
    return original_read_raw_data(request_handler)

  emulator_server._read_raw_data = read_raw_data  # pylint: disable=protected-access

  original_read_data = emulator_server._read_data  # pylint: disable=protected-access

  def read_data(request_handler, query):
    # An empty media upload (TensorFlow's "folder/" markers) is an empty
    # object, not a missing body (the emulator fails on len(None)).
    data = original_read_data(request_handler, query)
    content_type = request_handler.headers.get('Content-Type') or ''
    if (data is None and request_handler.headers.get('Content-Length') == '0'
        and not content_type.startswith(('application/json', 'multipart/'))):
      return b''
    return data

  emulator_server._read_data = read_data  # pylint: disable=protected-access

  def storage_layout(request, response, storage, *args, **kwargs):
    # TensorFlow 2.21's GCS filesystem asks a bucket's layout before a
    # directory rename (a hierarchical-namespace bucket renames folders
    # itself); GCS answers every bucket, the emulator 404s, which TF takes
    # as a failed rename. A flat bucket, as the emulator's are.
    del args, kwargs
    name = request.params.get('bucket_name')
    bucket = storage.buckets.get(name)
    if not bucket:
      response.status = http.HTTPStatus.NOT_FOUND
      return
    response.json({'kind': 'storage#storageLayout', 'bucket': name,
                   'location': bucket.get('location', 'US'),
                   'locationType': 'multi-region',
                   'hierarchicalNamespace': {'enabled': False}})

  emulator_server.HANDLERS = ((
      rf'^{re.escape(emulator_server.settings.API_ENDPOINT)}/b/'
      r'(?P<bucket_name>[-.\w]+)/storageLayout$',
      {emulator_server.GET: storage_layout}),) + emulator_server.HANDLERS

  backend_socket = socket.socket()
  backend_socket.bind((host, 0))
  backend_port = backend_socket.getsockname()[1]
  backend_socket.close()
  backend = emulator_server.create_server(host, backend_port, in_memory=True)
  backend.start()

  front = _Front((host, port), _FrontHandler)
  front.backend_port = backend_port
  front.object_store = object_store
  front.objects = _ObjectCache()
  front.first_byte_s = 0.0
  front.stream_bytes_per_s = 0.0
  front.tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
  front.tls.load_cert_chain(cert, key)
  logging.info('GCS emulator on %s:%d (backend port %d)', host, port,
               backend_port)
  threading.Thread(target=front.serve_forever, daemon=True).start()
  if parent_pid:
    threading.Thread(target=_exit_with_parent, args=(parent_pid,),
                     daemon=True).start()
  signal.sigwait({signal.SIGTERM, signal.SIGINT})


def _exit_with_parent(parent_pid: int) -> None:
  while os.getppid() == parent_pid:
    time.sleep(1.0)
  os._exit(0)  # pylint: disable=protected-access


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=serve.__doc__)
  parser.add_argument('--host', default=HOST)
  parser.add_argument('--port', type=int, required=True)
  parser.add_argument('--cert')
  parser.add_argument('--key')
  parser.add_argument('--relay-to', type=int, default=0,
                      help='relay to the front on this port instead')
  parser.add_argument('--parent-pid', type=int, default=0)
  parser.add_argument('--object-store', action='store_true',
                      help='answer object reads from the front, throttled')
  args = parser.parse_args(argv)
  signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
  if args.relay_to:
    relay(args.host, args.port, args.relay_to, args.parent_pid)
  else:
    serve(args.host, args.port, args.cert, args.key, args.parent_pid,
          args.object_store)


if __name__ == '__main__':
  main()

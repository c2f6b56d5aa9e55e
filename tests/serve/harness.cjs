// harness.cjs — what the server's end-to-end tests share: where the
// repository and the npm clients are, and a server started on an ephemeral
// loopback port (resolved once it prints its address) and stopped by signal.
//
// HEARTH_SOURCE_DIR  the repository (default: two folders up)
// HEARTH_DEPS_DIR    where tools/fetch_test_deps.sh installed node_modules
'use strict';
const { spawn } = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');

const SOURCE = process.env.HEARTH_SOURCE_DIR || path.resolve(__dirname, '../..');
const DEPS = process.env.HEARTH_DEPS_DIR || path.join(SOURCE, '.deps');

// An npm package from .deps/node/node_modules (a clear error when missing).
function need(name) {
  const dir = path.join(DEPS, 'node', 'node_modules', name);
  if (!fs.existsSync(dir)) throw new Error(`npm "${name}" is not installed at ${dir}: run tools/fetch_test_deps.sh`);
  return require(dir);
}

// Runs `exe args...`; resolves to {proc, log, url} once it prints "listening on URL".
function startServer(exe, args) {
  if (!exe) throw new Error('no server executable (HEARTH_E2E_SERVER is not set)');
  const proc = spawn(exe, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  const srv = { proc, log: '', url: null };
  return new Promise((resolve, reject) => {
    const onData = (d) => {
      srv.log += d.toString();
      const m = srv.log.match(/listening on (http:\/\/[^\s]+)/);
      if (m && !srv.url) {
        srv.url = m[1];
        resolve(srv);
      }
    };
    proc.stderr.on('data', onData);
    proc.stdout.on('data', onData);
    proc.on('exit', (code) => {
      if (!srv.url) reject(new Error(`server exited with ${code} before listening:\n${srv.log}`));
    });
    proc.on('error', reject);
  });
}

// Stops it with `signal` (SIGTERM); resolves to its exit code, or the signal's name when killed.
function stopServer(srv, signal = 'SIGTERM') {
  if (!srv) return Promise.resolve(0);
  if (srv.proc.exitCode !== null) return Promise.resolve(srv.proc.exitCode);
  return new Promise((resolve) => {
    srv.proc.on('exit', (code, sig) => resolve(sig || code));
    srv.proc.kill(signal);
  });
}

module.exports = { SOURCE, DEPS, need, startServer, stopServer };

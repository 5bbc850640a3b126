// SPDX-License-Identifier: Apache-2.0
//! Client programs more than one privileged test runs in its namespaces.

/// One long-lived connection: a line every 100 ms until killed; prints each answer or
/// the error.
pub const STREAM_CLIENT: &str = r#"
import socket, sys, time
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2)
f = s.makefile("rwb", buffering=0)
n = 0
while True:
    n += 1
    try:
        f.write(b"%d\n" % n)
        print("ok %.3f %s" % (time.time(), f.readline().decode().strip()), flush=True)
    except Exception as e:
        print("ERR %s" % e, flush=True)
        break
    time.sleep(0.1)
"#;

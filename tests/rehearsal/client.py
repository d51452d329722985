"""A stand-in's process: what a shim runs where a GPU program (nvidia-smi, vllm, a launcher, a stage,
pip) would start. Standard library only, started with `python -S`: it hands its arguments,
environment, directory and pid to its node's box (REHEARSAL_BOX, a unix socket), prints what the box
answers and exits with its status. A server's stand-in stays until it is killed, as a server does;
the box takes its closed connection for the server's end.

    python -S client.py KIND ARGV0 ARGS...
"""

import json
import os
import socket
import sys


def main() -> int:
    kind, argv = sys.argv[1], sys.argv[2:]
    request = {"kind": kind, "argv": argv, "env": dict(os.environ), "cwd": os.getcwd(), "pid": os.getpid()}
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(os.environ["REHEARSAL_BOX"])
        sock.sendall(json.dumps(request).encode() + b"\n")
        for line in sock.makefile("r", encoding="utf-8"):
            message = json.loads(line)
            if "exit" in message:
                return message["exit"]
            stream = sys.stdout if "stdout" in message else sys.stderr
            stream.write(message.get("stdout", message.get("stderr", "")))
            stream.flush()
    return 1  # the box ended first (the rehearsal is over)


if __name__ == "__main__":
    sys.exit(main())

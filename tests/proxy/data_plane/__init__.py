"""Fast unit tests of the data plane: the read loop's commands (``proxy/read_loop/loop.py``) and the
driver that does its I/O (``proxy/read_loop/driver.py``), against an upstream behind
``httpx.MockTransport`` and an in-memory store."""

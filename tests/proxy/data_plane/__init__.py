"""Fast unit tests of the data plane: the read loop's commands (``proxy/read_loop.py``) and the
driver that does its I/O (``proxy/loop_driver.py``), against an upstream behind
``httpx.MockTransport`` and an in-memory store."""

"""The wire: the only code that touches a WebSocket connection's socket, the server's and sync's client's.

`http` reads the HTTP/1.1 request every TCP connection to the server begins
with and routes it; `handshake` hands WebSocket upgrades (and whatever no
route answers) to websockets; `websocket` sends frames, watches the peer's
reading, pings and resets the connection.  It is the one place that uses
websockets beyond its documented API: tests/wire/test_websockets_seam.py
names each such use and fails on the one an upgrade changes.
"""

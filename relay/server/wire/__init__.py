"""The wire: the only code that touches a client's socket.

`http` reads the HTTP/1.1 request every TCP connection begins with and routes
it; `handshake` hands WebSocket upgrades (and whatever no route answers) to
websockets; `websocket` sends frames, watches the peer's reading, keeps the
connection alive and resets it.
"""

"""The wire: the only code that touches a client's socket.

`websocket` sends frames, watches the peer's reading, keeps the connection
alive and resets it.
"""

"""The local channel between the writer process and the worker processes of one relay (issue 16).

`frames.py` is the framing (4-byte big-endian length, then one orjson
object) and the frames' names; `writer.py` the writer's side (`ChannelServer`:
takes workers' verified events into ingest's writer stage, broadcasts commit
wake-ups, ephemeral events and heartbeats); `worker.py` a worker's side
(`WriterChannel`: submits events, answers their outcomes, tells of commits);
`follower.py` reads the change feed after each wake-up and fans the committed
events out to a worker's live subscriptions.
"""

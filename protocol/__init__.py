"""hotspare's wire contract: messages, framing and the job spec. Depends on nothing of ours."""

from protocol.errors import ConfigError, ProtocolError
from protocol.framing import (
    CONSOLE_MESSAGES,
    EXECUTOR_MESSAGES,
    MAX_FRAME,
    FrameBuffer,
    check_hello,
    encode_frame,
    read_message,
    recv_message,
    send_message,
    write_message,
)
from protocol.messages import *  # noqa: F403
from protocol.messages import PROTOCOL_VERSION, ConsoleMessage, ExecutorMessage
from protocol.spec import PLACEMENT_KEYS, CheckpointManifest, JobSpec

__all__ = [
    "CONSOLE_MESSAGES",
    "EXECUTOR_MESSAGES",
    "MAX_FRAME",
    "PLACEMENT_KEYS",
    "PROTOCOL_VERSION",
    "CheckpointManifest",
    "ConfigError",
    "ConsoleMessage",
    "ExecutorMessage",
    "FrameBuffer",
    "JobSpec",
    "ProtocolError",
    "check_hello",
    "encode_frame",
    "read_message",
    "recv_message",
    "send_message",
    "write_message",
]

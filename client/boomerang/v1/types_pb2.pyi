import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EngineRole(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ENGINE_ROLE_UNSPECIFIED: _ClassVar[EngineRole]
    ENGINE_ROLE_PREFILL: _ClassVar[EngineRole]
    ENGINE_ROLE_DECODE: _ClassVar[EngineRole]

class EngineStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ENGINE_STATUS_UNSPECIFIED: _ClassVar[EngineStatus]
    ENGINE_STATUS_ACTIVE: _ClassVar[EngineStatus]
    ENGINE_STATUS_DEAD: _ClassVar[EngineStatus]

class LeaseState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LEASE_STATE_UNSPECIFIED: _ClassVar[LeaseState]
    LEASE_STATE_RETAINED: _ClassVar[LeaseState]
    LEASE_STATE_CLAIMED: _ClassVar[LeaseState]
    LEASE_STATE_CONSUMED: _ClassVar[LeaseState]
    LEASE_STATE_EXPIRED: _ClassVar[LeaseState]
    LEASE_STATE_SUPERSEDED: _ClassVar[LeaseState]
    LEASE_STATE_INVALIDATED: _ClassVar[LeaseState]
    LEASE_STATE_RELEASED: _ClassVar[LeaseState]
ENGINE_ROLE_UNSPECIFIED: EngineRole
ENGINE_ROLE_PREFILL: EngineRole
ENGINE_ROLE_DECODE: EngineRole
ENGINE_STATUS_UNSPECIFIED: EngineStatus
ENGINE_STATUS_ACTIVE: EngineStatus
ENGINE_STATUS_DEAD: EngineStatus
LEASE_STATE_UNSPECIFIED: LeaseState
LEASE_STATE_RETAINED: LeaseState
LEASE_STATE_CLAIMED: LeaseState
LEASE_STATE_CONSUMED: LeaseState
LEASE_STATE_EXPIRED: LeaseState
LEASE_STATE_SUPERSEDED: LeaseState
LEASE_STATE_INVALIDATED: LeaseState
LEASE_STATE_RELEASED: LeaseState

class Engine(_message.Message):
    __slots__ = ("engine_id", "role", "model", "side_channel_host", "side_channel_port", "http_base_url", "registration_generation", "kv_blocks_ttl_seconds", "block_size", "tp_size", "dcp_size", "pp_size", "bytes_per_block", "status", "register_time", "heartbeat_time", "in_flight_requests", "queued_prompt_tokens", "retained_blocks", "kv_recompute_threshold", "free_kv_blocks", "total_kv_blocks")
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    SIDE_CHANNEL_HOST_FIELD_NUMBER: _ClassVar[int]
    SIDE_CHANNEL_PORT_FIELD_NUMBER: _ClassVar[int]
    HTTP_BASE_URL_FIELD_NUMBER: _ClassVar[int]
    REGISTRATION_GENERATION_FIELD_NUMBER: _ClassVar[int]
    KV_BLOCKS_TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    TP_SIZE_FIELD_NUMBER: _ClassVar[int]
    DCP_SIZE_FIELD_NUMBER: _ClassVar[int]
    PP_SIZE_FIELD_NUMBER: _ClassVar[int]
    BYTES_PER_BLOCK_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REGISTER_TIME_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_TIME_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    QUEUED_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RETAINED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    KV_RECOMPUTE_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    FREE_KV_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_KV_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    engine_id: str
    role: EngineRole
    model: str
    side_channel_host: str
    side_channel_port: int
    http_base_url: str
    registration_generation: int
    kv_blocks_ttl_seconds: int
    block_size: int
    tp_size: int
    dcp_size: int
    pp_size: int
    bytes_per_block: int
    status: EngineStatus
    register_time: _timestamp_pb2.Timestamp
    heartbeat_time: _timestamp_pb2.Timestamp
    in_flight_requests: int
    queued_prompt_tokens: int
    retained_blocks: int
    kv_recompute_threshold: int
    free_kv_blocks: int
    total_kv_blocks: int
    def __init__(self, engine_id: _Optional[str] = ..., role: _Optional[_Union[EngineRole, str]] = ..., model: _Optional[str] = ..., side_channel_host: _Optional[str] = ..., side_channel_port: _Optional[int] = ..., http_base_url: _Optional[str] = ..., registration_generation: _Optional[int] = ..., kv_blocks_ttl_seconds: _Optional[int] = ..., block_size: _Optional[int] = ..., tp_size: _Optional[int] = ..., dcp_size: _Optional[int] = ..., pp_size: _Optional[int] = ..., bytes_per_block: _Optional[int] = ..., status: _Optional[_Union[EngineStatus, str]] = ..., register_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., heartbeat_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., in_flight_requests: _Optional[int] = ..., queued_prompt_tokens: _Optional[int] = ..., retained_blocks: _Optional[int] = ..., kv_recompute_threshold: _Optional[int] = ..., free_kv_blocks: _Optional[int] = ..., total_kv_blocks: _Optional[int] = ...) -> None: ...

class BlockIdGroup(_message.Message):
    __slots__ = ("block_ids",)
    BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    block_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, block_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class TokenChain(_message.Message):
    __slots__ = ("block_size", "num_tokens", "block_hashes", "tail_hash")
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    TAIL_HASH_FIELD_NUMBER: _ClassVar[int]
    block_size: int
    num_tokens: int
    block_hashes: bytes
    tail_hash: bytes
    def __init__(self, block_size: _Optional[int] = ..., num_tokens: _Optional[int] = ..., block_hashes: _Optional[bytes] = ..., tail_hash: _Optional[bytes] = ...) -> None: ...

class KvTransferParams(_message.Message):
    __slots__ = ("do_remote_decode", "do_remote_prefill", "remote_block_groups", "remote_engine_id", "remote_request_id", "remote_host", "remote_port", "tp_size", "dcp_size", "pp_size", "remote_num_tokens", "remote_blocks_expiry_time", "remote_registration_generation", "transfer_mode")
    DO_REMOTE_DECODE_FIELD_NUMBER: _ClassVar[int]
    DO_REMOTE_PREFILL_FIELD_NUMBER: _ClassVar[int]
    REMOTE_BLOCK_GROUPS_FIELD_NUMBER: _ClassVar[int]
    REMOTE_ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    REMOTE_REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    REMOTE_HOST_FIELD_NUMBER: _ClassVar[int]
    REMOTE_PORT_FIELD_NUMBER: _ClassVar[int]
    TP_SIZE_FIELD_NUMBER: _ClassVar[int]
    DCP_SIZE_FIELD_NUMBER: _ClassVar[int]
    PP_SIZE_FIELD_NUMBER: _ClassVar[int]
    REMOTE_NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REMOTE_BLOCKS_EXPIRY_TIME_FIELD_NUMBER: _ClassVar[int]
    REMOTE_REGISTRATION_GENERATION_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_MODE_FIELD_NUMBER: _ClassVar[int]
    do_remote_decode: bool
    do_remote_prefill: bool
    remote_block_groups: _containers.RepeatedCompositeFieldContainer[BlockIdGroup]
    remote_engine_id: str
    remote_request_id: str
    remote_host: str
    remote_port: int
    tp_size: int
    dcp_size: int
    pp_size: int
    remote_num_tokens: int
    remote_blocks_expiry_time: float
    remote_registration_generation: int
    transfer_mode: str
    def __init__(self, do_remote_decode: _Optional[bool] = ..., do_remote_prefill: _Optional[bool] = ..., remote_block_groups: _Optional[_Iterable[_Union[BlockIdGroup, _Mapping]]] = ..., remote_engine_id: _Optional[str] = ..., remote_request_id: _Optional[str] = ..., remote_host: _Optional[str] = ..., remote_port: _Optional[int] = ..., tp_size: _Optional[int] = ..., dcp_size: _Optional[int] = ..., pp_size: _Optional[int] = ..., remote_num_tokens: _Optional[int] = ..., remote_blocks_expiry_time: _Optional[float] = ..., remote_registration_generation: _Optional[int] = ..., transfer_mode: _Optional[str] = ...) -> None: ...

class Lease(_message.Message):
    __slots__ = ("lease_id", "tenant", "conversation_id", "engine_id", "engine_generation", "remote_request_id", "block_groups", "num_tokens", "block_size", "state", "version", "claim_id", "finish_time", "create_time", "expire_time", "update_time", "remote_host", "remote_port", "tp_size", "dcp_size", "pp_size", "model")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    ENGINE_GENERATION_FIELD_NUMBER: _ClassVar[int]
    REMOTE_REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCK_GROUPS_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CLAIM_ID_FIELD_NUMBER: _ClassVar[int]
    FINISH_TIME_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_FIELD_NUMBER: _ClassVar[int]
    REMOTE_HOST_FIELD_NUMBER: _ClassVar[int]
    REMOTE_PORT_FIELD_NUMBER: _ClassVar[int]
    TP_SIZE_FIELD_NUMBER: _ClassVar[int]
    DCP_SIZE_FIELD_NUMBER: _ClassVar[int]
    PP_SIZE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    tenant: str
    conversation_id: str
    engine_id: str
    engine_generation: int
    remote_request_id: str
    block_groups: _containers.RepeatedCompositeFieldContainer[BlockIdGroup]
    num_tokens: int
    block_size: int
    state: LeaseState
    version: int
    claim_id: str
    finish_time: _timestamp_pb2.Timestamp
    create_time: _timestamp_pb2.Timestamp
    expire_time: _timestamp_pb2.Timestamp
    update_time: _timestamp_pb2.Timestamp
    remote_host: str
    remote_port: int
    tp_size: int
    dcp_size: int
    pp_size: int
    model: str
    def __init__(self, lease_id: _Optional[str] = ..., tenant: _Optional[str] = ..., conversation_id: _Optional[str] = ..., engine_id: _Optional[str] = ..., engine_generation: _Optional[int] = ..., remote_request_id: _Optional[str] = ..., block_groups: _Optional[_Iterable[_Union[BlockIdGroup, _Mapping]]] = ..., num_tokens: _Optional[int] = ..., block_size: _Optional[int] = ..., state: _Optional[_Union[LeaseState, str]] = ..., version: _Optional[int] = ..., claim_id: _Optional[str] = ..., finish_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., update_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., remote_host: _Optional[str] = ..., remote_port: _Optional[int] = ..., tp_size: _Optional[int] = ..., dcp_size: _Optional[int] = ..., pp_size: _Optional[int] = ..., model: _Optional[str] = ...) -> None: ...

class LeaseEvent(_message.Message):
    __slots__ = ("event_id", "lease_id", "from_state", "to_state", "reason", "actor", "request_id", "event_time", "claim_id")
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_STATE_FIELD_NUMBER: _ClassVar[int]
    TO_STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    EVENT_TIME_FIELD_NUMBER: _ClassVar[int]
    CLAIM_ID_FIELD_NUMBER: _ClassVar[int]
    event_id: int
    lease_id: str
    from_state: LeaseState
    to_state: LeaseState
    reason: str
    actor: str
    request_id: str
    event_time: _timestamp_pb2.Timestamp
    claim_id: str
    def __init__(self, event_id: _Optional[int] = ..., lease_id: _Optional[str] = ..., from_state: _Optional[_Union[LeaseState, str]] = ..., to_state: _Optional[_Union[LeaseState, str]] = ..., reason: _Optional[str] = ..., actor: _Optional[str] = ..., request_id: _Optional[str] = ..., event_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., claim_id: _Optional[str] = ...) -> None: ...

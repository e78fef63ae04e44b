import datetime

from boomerang.v1 import types_pb2 as _types_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ClaimOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CLAIM_OUTCOME_UNSPECIFIED: _ClassVar[ClaimOutcome]
    CLAIM_OUTCOME_CLAIMED: _ClassVar[ClaimOutcome]
    CLAIM_OUTCOME_NO_LEASE: _ClassVar[ClaimOutcome]
    CLAIM_OUTCOME_EXPIRING: _ClassVar[ClaimOutcome]
    CLAIM_OUTCOME_PREFIX_MISMATCH: _ClassVar[ClaimOutcome]
    CLAIM_OUTCOME_BELOW_THRESHOLD: _ClassVar[ClaimOutcome]
    CLAIM_OUTCOME_ENGINE_INVALID: _ClassVar[ClaimOutcome]
    CLAIM_OUTCOME_ALREADY_CLAIMED: _ClassVar[ClaimOutcome]
    CLAIM_OUTCOME_BLOCK_SIZE_MISMATCH: _ClassVar[ClaimOutcome]
    CLAIM_OUTCOME_LEASE_RELEASED: _ClassVar[ClaimOutcome]

class ClaimUse(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CLAIM_USE_UNSPECIFIED: _ClassVar[ClaimUse]
    CLAIM_USE_READ: _ClassVar[ClaimUse]
    CLAIM_USE_NOT_READ: _ClassVar[ClaimUse]
CLAIM_OUTCOME_UNSPECIFIED: ClaimOutcome
CLAIM_OUTCOME_CLAIMED: ClaimOutcome
CLAIM_OUTCOME_NO_LEASE: ClaimOutcome
CLAIM_OUTCOME_EXPIRING: ClaimOutcome
CLAIM_OUTCOME_PREFIX_MISMATCH: ClaimOutcome
CLAIM_OUTCOME_BELOW_THRESHOLD: ClaimOutcome
CLAIM_OUTCOME_ENGINE_INVALID: ClaimOutcome
CLAIM_OUTCOME_ALREADY_CLAIMED: ClaimOutcome
CLAIM_OUTCOME_BLOCK_SIZE_MISMATCH: ClaimOutcome
CLAIM_OUTCOME_LEASE_RELEASED: ClaimOutcome
CLAIM_USE_UNSPECIFIED: ClaimUse
CLAIM_USE_READ: ClaimUse
CLAIM_USE_NOT_READ: ClaimUse

class RegisterEngineRequest(_message.Message):
    __slots__ = ("engine", "request_id")
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    engine: _types_pb2.Engine
    request_id: str
    def __init__(self, engine: _Optional[_Union[_types_pb2.Engine, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...

class RegisterEngineResponse(_message.Message):
    __slots__ = ("engine", "invalidated_leases")
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    INVALIDATED_LEASES_FIELD_NUMBER: _ClassVar[int]
    engine: _types_pb2.Engine
    invalidated_leases: int
    def __init__(self, engine: _Optional[_Union[_types_pb2.Engine, _Mapping]] = ..., invalidated_leases: _Optional[int] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("engine_id", "registration_generation", "in_flight_requests", "queued_prompt_tokens", "free_kv_blocks", "total_kv_blocks", "take_releases")
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    REGISTRATION_GENERATION_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    QUEUED_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FREE_KV_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_KV_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    TAKE_RELEASES_FIELD_NUMBER: _ClassVar[int]
    engine_id: str
    registration_generation: int
    in_flight_requests: int
    queued_prompt_tokens: int
    free_kv_blocks: int
    total_kv_blocks: int
    take_releases: bool
    def __init__(self, engine_id: _Optional[str] = ..., registration_generation: _Optional[int] = ..., in_flight_requests: _Optional[int] = ..., queued_prompt_tokens: _Optional[int] = ..., free_kv_blocks: _Optional[int] = ..., total_kv_blocks: _Optional[int] = ..., take_releases: _Optional[bool] = ...) -> None: ...

class ReleasedTurn(_message.Message):
    __slots__ = ("remote_request_id", "state", "lease_id")
    REMOTE_REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    remote_request_id: str
    state: _types_pb2.LeaseState
    lease_id: str
    def __init__(self, remote_request_id: _Optional[str] = ..., state: _Optional[_Union[_types_pb2.LeaseState, str]] = ..., lease_id: _Optional[str] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("engine", "released")
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    engine: _types_pb2.Engine
    released: _containers.RepeatedCompositeFieldContainer[ReleasedTurn]
    def __init__(self, engine: _Optional[_Union[_types_pb2.Engine, _Mapping]] = ..., released: _Optional[_Iterable[_Union[ReleasedTurn, _Mapping]]] = ...) -> None: ...

class RegisterRetainedBlocksRequest(_message.Message):
    __slots__ = ("tenant", "conversation_id", "engine_id", "engine_generation", "remote_request_id", "block_groups", "num_tokens", "token_chain", "finish_time_unix", "remote_host", "remote_port", "model", "request_id", "prompt_tokens", "prompt_tail_token_ids")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    ENGINE_GENERATION_FIELD_NUMBER: _ClassVar[int]
    REMOTE_REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCK_GROUPS_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_CHAIN_FIELD_NUMBER: _ClassVar[int]
    FINISH_TIME_UNIX_FIELD_NUMBER: _ClassVar[int]
    REMOTE_HOST_FIELD_NUMBER: _ClassVar[int]
    REMOTE_PORT_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TAIL_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    conversation_id: str
    engine_id: str
    engine_generation: int
    remote_request_id: str
    block_groups: _containers.RepeatedCompositeFieldContainer[_types_pb2.BlockIdGroup]
    num_tokens: int
    token_chain: _types_pb2.TokenChain
    finish_time_unix: float
    remote_host: str
    remote_port: int
    model: str
    request_id: str
    prompt_tokens: int
    prompt_tail_token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, tenant: _Optional[str] = ..., conversation_id: _Optional[str] = ..., engine_id: _Optional[str] = ..., engine_generation: _Optional[int] = ..., remote_request_id: _Optional[str] = ..., block_groups: _Optional[_Iterable[_Union[_types_pb2.BlockIdGroup, _Mapping]]] = ..., num_tokens: _Optional[int] = ..., token_chain: _Optional[_Union[_types_pb2.TokenChain, _Mapping]] = ..., finish_time_unix: _Optional[float] = ..., remote_host: _Optional[str] = ..., remote_port: _Optional[int] = ..., model: _Optional[str] = ..., request_id: _Optional[str] = ..., prompt_tokens: _Optional[int] = ..., prompt_tail_token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class RegisterRetainedBlocksResponse(_message.Message):
    __slots__ = ("lease", "created", "superseded_leases")
    LEASE_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    SUPERSEDED_LEASES_FIELD_NUMBER: _ClassVar[int]
    lease: _types_pb2.Lease
    created: bool
    superseded_leases: int
    def __init__(self, lease: _Optional[_Union[_types_pb2.Lease, _Mapping]] = ..., created: _Optional[bool] = ..., superseded_leases: _Optional[int] = ...) -> None: ...

class RegisterRetainedBlocksBatchRequest(_message.Message):
    __slots__ = ("registrations",)
    REGISTRATIONS_FIELD_NUMBER: _ClassVar[int]
    registrations: _containers.RepeatedCompositeFieldContainer[RegisterRetainedBlocksRequest]
    def __init__(self, registrations: _Optional[_Iterable[_Union[RegisterRetainedBlocksRequest, _Mapping]]] = ...) -> None: ...

class RegisterRetainedBlocksBatchResult(_message.Message):
    __slots__ = ("response", "error_code", "error_reason", "error_message")
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_REASON_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    response: RegisterRetainedBlocksResponse
    error_code: int
    error_reason: str
    error_message: str
    def __init__(self, response: _Optional[_Union[RegisterRetainedBlocksResponse, _Mapping]] = ..., error_code: _Optional[int] = ..., error_reason: _Optional[str] = ..., error_message: _Optional[str] = ...) -> None: ...

class RegisterRetainedBlocksBatchResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[RegisterRetainedBlocksBatchResult]
    def __init__(self, results: _Optional[_Iterable[_Union[RegisterRetainedBlocksBatchResult, _Mapping]]] = ...) -> None: ...

class ClaimReuseRequest(_message.Message):
    __slots__ = ("tenant", "conversation_id", "prompt_chain", "min_reusable_tokens", "min_remaining_seconds", "claim_id", "model", "prompt_token_ids")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_CHAIN_FIELD_NUMBER: _ClassVar[int]
    MIN_REUSABLE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MIN_REMAINING_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CLAIM_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    conversation_id: str
    prompt_chain: _types_pb2.TokenChain
    min_reusable_tokens: int
    min_remaining_seconds: float
    claim_id: str
    model: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, tenant: _Optional[str] = ..., conversation_id: _Optional[str] = ..., prompt_chain: _Optional[_Union[_types_pb2.TokenChain, _Mapping]] = ..., min_reusable_tokens: _Optional[int] = ..., min_remaining_seconds: _Optional[float] = ..., claim_id: _Optional[str] = ..., model: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class ClaimReuseResponse(_message.Message):
    __slots__ = ("outcome", "lease", "reusable_tokens", "remaining_seconds")
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    REUSABLE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REMAINING_SECONDS_FIELD_NUMBER: _ClassVar[int]
    outcome: ClaimOutcome
    lease: _types_pb2.Lease
    reusable_tokens: int
    remaining_seconds: float
    def __init__(self, outcome: _Optional[_Union[ClaimOutcome, str]] = ..., lease: _Optional[_Union[_types_pb2.Lease, _Mapping]] = ..., reusable_tokens: _Optional[int] = ..., remaining_seconds: _Optional[float] = ...) -> None: ...

class ClaimReuseBatchRequest(_message.Message):
    __slots__ = ("claims",)
    CLAIMS_FIELD_NUMBER: _ClassVar[int]
    claims: _containers.RepeatedCompositeFieldContainer[ClaimReuseRequest]
    def __init__(self, claims: _Optional[_Iterable[_Union[ClaimReuseRequest, _Mapping]]] = ...) -> None: ...

class ClaimReuseBatchResult(_message.Message):
    __slots__ = ("response", "error_code", "error_reason", "error_message")
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_REASON_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    response: ClaimReuseResponse
    error_code: int
    error_reason: str
    error_message: str
    def __init__(self, response: _Optional[_Union[ClaimReuseResponse, _Mapping]] = ..., error_code: _Optional[int] = ..., error_reason: _Optional[str] = ..., error_message: _Optional[str] = ...) -> None: ...

class ClaimReuseBatchResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[ClaimReuseBatchResult]
    def __init__(self, results: _Optional[_Iterable[_Union[ClaimReuseBatchResult, _Mapping]]] = ...) -> None: ...

class TurnClaim(_message.Message):
    __slots__ = ("lease_id", "claim_id", "use", "release_reason")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    CLAIM_ID_FIELD_NUMBER: _ClassVar[int]
    USE_FIELD_NUMBER: _ClassVar[int]
    RELEASE_REASON_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    claim_id: str
    use: ClaimUse
    release_reason: str
    def __init__(self, lease_id: _Optional[str] = ..., claim_id: _Optional[str] = ..., use: _Optional[_Union[ClaimUse, str]] = ..., release_reason: _Optional[str] = ...) -> None: ...

class CompleteTurnRequest(_message.Message):
    __slots__ = ("tenant", "claim", "registration")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    CLAIM_FIELD_NUMBER: _ClassVar[int]
    REGISTRATION_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    claim: TurnClaim
    registration: RegisterRetainedBlocksRequest
    def __init__(self, tenant: _Optional[str] = ..., claim: _Optional[_Union[TurnClaim, _Mapping]] = ..., registration: _Optional[_Union[RegisterRetainedBlocksRequest, _Mapping]] = ...) -> None: ...

class TurnClaimResult(_message.Message):
    __slots__ = ("lease", "error_code", "error_reason", "error_message")
    LEASE_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_REASON_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    lease: _types_pb2.Lease
    error_code: int
    error_reason: str
    error_message: str
    def __init__(self, lease: _Optional[_Union[_types_pb2.Lease, _Mapping]] = ..., error_code: _Optional[int] = ..., error_reason: _Optional[str] = ..., error_message: _Optional[str] = ...) -> None: ...

class CompleteTurnResponse(_message.Message):
    __slots__ = ("claim", "registration")
    CLAIM_FIELD_NUMBER: _ClassVar[int]
    REGISTRATION_FIELD_NUMBER: _ClassVar[int]
    claim: TurnClaimResult
    registration: RegisterRetainedBlocksBatchResult
    def __init__(self, claim: _Optional[_Union[TurnClaimResult, _Mapping]] = ..., registration: _Optional[_Union[RegisterRetainedBlocksBatchResult, _Mapping]] = ...) -> None: ...

class InvalidateEngineRequest(_message.Message):
    __slots__ = ("engine_id", "below_generation", "reason", "request_id")
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    BELOW_GENERATION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    engine_id: str
    below_generation: int
    reason: str
    request_id: str
    def __init__(self, engine_id: _Optional[str] = ..., below_generation: _Optional[int] = ..., reason: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class InvalidateEngineResponse(_message.Message):
    __slots__ = ("invalidated_leases",)
    INVALIDATED_LEASES_FIELD_NUMBER: _ClassVar[int]
    invalidated_leases: int
    def __init__(self, invalidated_leases: _Optional[int] = ...) -> None: ...

class GetConversationRequest(_message.Message):
    __slots__ = ("tenant", "conversation_id", "include_events")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_EVENTS_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    conversation_id: str
    include_events: bool
    def __init__(self, tenant: _Optional[str] = ..., conversation_id: _Optional[str] = ..., include_events: _Optional[bool] = ...) -> None: ...

class GetConversationResponse(_message.Message):
    __slots__ = ("leases", "events")
    LEASES_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    leases: _containers.RepeatedCompositeFieldContainer[_types_pb2.Lease]
    events: _containers.RepeatedCompositeFieldContainer[_types_pb2.LeaseEvent]
    def __init__(self, leases: _Optional[_Iterable[_Union[_types_pb2.Lease, _Mapping]]] = ..., events: _Optional[_Iterable[_Union[_types_pb2.LeaseEvent, _Mapping]]] = ...) -> None: ...

class ListLeasesRequest(_message.Message):
    __slots__ = ("tenant", "engine_id", "states", "page_size", "page_token")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    STATES_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    engine_id: str
    states: _containers.RepeatedScalarFieldContainer[_types_pb2.LeaseState]
    page_size: int
    page_token: str
    def __init__(self, tenant: _Optional[str] = ..., engine_id: _Optional[str] = ..., states: _Optional[_Iterable[_Union[_types_pb2.LeaseState, str]]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListLeasesResponse(_message.Message):
    __slots__ = ("leases", "next_page_token")
    LEASES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    leases: _containers.RepeatedCompositeFieldContainer[_types_pb2.Lease]
    next_page_token: str
    def __init__(self, leases: _Optional[_Iterable[_Union[_types_pb2.Lease, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ListEnginesRequest(_message.Message):
    __slots__ = ("model", "role")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    model: str
    role: _types_pb2.EngineRole
    def __init__(self, model: _Optional[str] = ..., role: _Optional[_Union[_types_pb2.EngineRole, str]] = ...) -> None: ...

class ListEnginesResponse(_message.Message):
    __slots__ = ("engines",)
    ENGINES_FIELD_NUMBER: _ClassVar[int]
    engines: _containers.RepeatedCompositeFieldContainer[_types_pb2.Engine]
    def __init__(self, engines: _Optional[_Iterable[_Union[_types_pb2.Engine, _Mapping]]] = ...) -> None: ...

class ReaperFence(_message.Message):
    __slots__ = ("election", "term")
    ELECTION_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    election: str
    term: int
    def __init__(self, election: _Optional[str] = ..., term: _Optional[int] = ...) -> None: ...

class WatchLeaseDeadlinesRequest(_message.Message):
    __slots__ = ("watcher",)
    WATCHER_FIELD_NUMBER: _ClassVar[int]
    watcher: str
    def __init__(self, watcher: _Optional[str] = ...) -> None: ...

class WatchLeaseDeadlinesResponse(_message.Message):
    __slots__ = ("snapshot", "earliest_expire_time", "live_leases", "database_time")
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    EARLIEST_EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    LIVE_LEASES_FIELD_NUMBER: _ClassVar[int]
    DATABASE_TIME_FIELD_NUMBER: _ClassVar[int]
    snapshot: bool
    earliest_expire_time: _timestamp_pb2.Timestamp
    live_leases: int
    database_time: _timestamp_pb2.Timestamp
    def __init__(self, snapshot: _Optional[bool] = ..., earliest_expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., live_leases: _Optional[int] = ..., database_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class WatchLeaseKeysRequest(_message.Message):
    __slots__ = ("watcher",)
    WATCHER_FIELD_NUMBER: _ClassVar[int]
    watcher: str
    def __init__(self, watcher: _Optional[str] = ...) -> None: ...

class WatchLeaseKeysResponse(_message.Message):
    __slots__ = ("snapshot", "snapshot_complete", "keys", "live_leases")
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_COMPLETE_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    LIVE_LEASES_FIELD_NUMBER: _ClassVar[int]
    snapshot: bool
    snapshot_complete: bool
    keys: bytes
    live_leases: int
    def __init__(self, snapshot: _Optional[bool] = ..., snapshot_complete: _Optional[bool] = ..., keys: _Optional[bytes] = ..., live_leases: _Optional[int] = ...) -> None: ...

class ExpireLeasesRequest(_message.Message):
    __slots__ = ("fence", "max_leases", "actor", "request_id")
    FENCE_FIELD_NUMBER: _ClassVar[int]
    MAX_LEASES_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    fence: ReaperFence
    max_leases: int
    actor: str
    request_id: str
    def __init__(self, fence: _Optional[_Union[ReaperFence, _Mapping]] = ..., max_leases: _Optional[int] = ..., actor: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class ExpiredLease(_message.Message):
    __slots__ = ("lease_id", "tenant", "conversation_id", "from_state", "expire_time", "lag_seconds")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_STATE_FIELD_NUMBER: _ClassVar[int]
    EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    LAG_SECONDS_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    tenant: str
    conversation_id: str
    from_state: _types_pb2.LeaseState
    expire_time: _timestamp_pb2.Timestamp
    lag_seconds: float
    def __init__(self, lease_id: _Optional[str] = ..., tenant: _Optional[str] = ..., conversation_id: _Optional[str] = ..., from_state: _Optional[_Union[_types_pb2.LeaseState, str]] = ..., expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., lag_seconds: _Optional[float] = ...) -> None: ...

class ExpireLeasesResponse(_message.Message):
    __slots__ = ("expired_leases", "more_due", "next_expire_time", "database_time")
    EXPIRED_LEASES_FIELD_NUMBER: _ClassVar[int]
    MORE_DUE_FIELD_NUMBER: _ClassVar[int]
    NEXT_EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    DATABASE_TIME_FIELD_NUMBER: _ClassVar[int]
    expired_leases: _containers.RepeatedCompositeFieldContainer[ExpiredLease]
    more_due: bool
    next_expire_time: _timestamp_pb2.Timestamp
    database_time: _timestamp_pb2.Timestamp
    def __init__(self, expired_leases: _Optional[_Iterable[_Union[ExpiredLease, _Mapping]]] = ..., more_due: _Optional[bool] = ..., next_expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., database_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class SweepEnginesRequest(_message.Message):
    __slots__ = ("fence", "heartbeat_timeout_seconds", "actor", "request_id")
    FENCE_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    fence: ReaperFence
    heartbeat_timeout_seconds: float
    actor: str
    request_id: str
    def __init__(self, fence: _Optional[_Union[ReaperFence, _Mapping]] = ..., heartbeat_timeout_seconds: _Optional[float] = ..., actor: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class SweepEnginesResponse(_message.Message):
    __slots__ = ("dead_engine_ids", "heartbeat_timeout_leases", "dead_engine_leases", "stale_generation_leases", "database_time")
    DEAD_ENGINE_IDS_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_TIMEOUT_LEASES_FIELD_NUMBER: _ClassVar[int]
    DEAD_ENGINE_LEASES_FIELD_NUMBER: _ClassVar[int]
    STALE_GENERATION_LEASES_FIELD_NUMBER: _ClassVar[int]
    DATABASE_TIME_FIELD_NUMBER: _ClassVar[int]
    dead_engine_ids: _containers.RepeatedScalarFieldContainer[str]
    heartbeat_timeout_leases: int
    dead_engine_leases: int
    stale_generation_leases: int
    database_time: _timestamp_pb2.Timestamp
    def __init__(self, dead_engine_ids: _Optional[_Iterable[str]] = ..., heartbeat_timeout_leases: _Optional[int] = ..., dead_engine_leases: _Optional[int] = ..., stale_generation_leases: _Optional[int] = ..., database_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class EnforceEventRetentionRequest(_message.Message):
    __slots__ = ("fence", "retention_days", "days_ahead", "request_id")
    FENCE_FIELD_NUMBER: _ClassVar[int]
    RETENTION_DAYS_FIELD_NUMBER: _ClassVar[int]
    DAYS_AHEAD_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    fence: ReaperFence
    retention_days: int
    days_ahead: int
    request_id: str
    def __init__(self, fence: _Optional[_Union[ReaperFence, _Mapping]] = ..., retention_days: _Optional[int] = ..., days_ahead: _Optional[int] = ..., request_id: _Optional[str] = ...) -> None: ...

class EnforceEventRetentionResponse(_message.Message):
    __slots__ = ("dropped_partitions", "busy_partitions", "created_partitions", "cutoff_time")
    DROPPED_PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    BUSY_PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    CREATED_PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    CUTOFF_TIME_FIELD_NUMBER: _ClassVar[int]
    dropped_partitions: _containers.RepeatedScalarFieldContainer[str]
    busy_partitions: _containers.RepeatedScalarFieldContainer[str]
    created_partitions: int
    cutoff_time: _timestamp_pb2.Timestamp
    def __init__(self, dropped_partitions: _Optional[_Iterable[str]] = ..., busy_partitions: _Optional[_Iterable[str]] = ..., created_partitions: _Optional[int] = ..., cutoff_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ReleaseLeasesRequest(_message.Message):
    __slots__ = ("fence", "lease_ids", "reason", "actor", "request_id")
    FENCE_FIELD_NUMBER: _ClassVar[int]
    LEASE_IDS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    fence: ReaperFence
    lease_ids: _containers.RepeatedScalarFieldContainer[str]
    reason: str
    actor: str
    request_id: str
    def __init__(self, fence: _Optional[_Union[ReaperFence, _Mapping]] = ..., lease_ids: _Optional[_Iterable[str]] = ..., reason: _Optional[str] = ..., actor: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class ReleaseLeasesResponse(_message.Message):
    __slots__ = ("released_lease_ids",)
    RELEASED_LEASE_IDS_FIELD_NUMBER: _ClassVar[int]
    released_lease_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, released_lease_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class CountLiveLeasesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CountLiveLeasesResponse(_message.Message):
    __slots__ = ("live_leases", "overdue_leases", "next_expire_time", "database_time")
    LIVE_LEASES_FIELD_NUMBER: _ClassVar[int]
    OVERDUE_LEASES_FIELD_NUMBER: _ClassVar[int]
    NEXT_EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    DATABASE_TIME_FIELD_NUMBER: _ClassVar[int]
    live_leases: int
    overdue_leases: int
    next_expire_time: _timestamp_pb2.Timestamp
    database_time: _timestamp_pb2.Timestamp
    def __init__(self, live_leases: _Optional[int] = ..., overdue_leases: _Optional[int] = ..., next_expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., database_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ListRegistrationsRequest(_message.Message):
    __slots__ = ("tenant", "history_hours", "page_size", "page_token")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    HISTORY_HOURS_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    history_hours: float
    page_size: int
    page_token: str
    def __init__(self, tenant: _Optional[str] = ..., history_hours: _Optional[float] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class Registration(_message.Message):
    __slots__ = ("lease_id", "tenant", "model", "conversation_id", "num_blocks", "state", "finish_time", "first_claim_time", "bytes_per_block", "engine_ttl_seconds")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    FINISH_TIME_FIELD_NUMBER: _ClassVar[int]
    FIRST_CLAIM_TIME_FIELD_NUMBER: _ClassVar[int]
    BYTES_PER_BLOCK_FIELD_NUMBER: _ClassVar[int]
    ENGINE_TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    tenant: str
    model: str
    conversation_id: str
    num_blocks: int
    state: _types_pb2.LeaseState
    finish_time: _timestamp_pb2.Timestamp
    first_claim_time: _timestamp_pb2.Timestamp
    bytes_per_block: int
    engine_ttl_seconds: int
    def __init__(self, lease_id: _Optional[str] = ..., tenant: _Optional[str] = ..., model: _Optional[str] = ..., conversation_id: _Optional[str] = ..., num_blocks: _Optional[int] = ..., state: _Optional[_Union[_types_pb2.LeaseState, str]] = ..., finish_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., first_claim_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., bytes_per_block: _Optional[int] = ..., engine_ttl_seconds: _Optional[int] = ...) -> None: ...

class ListRegistrationsResponse(_message.Message):
    __slots__ = ("registrations", "history_start_time", "history_end_time", "next_page_token")
    REGISTRATIONS_FIELD_NUMBER: _ClassVar[int]
    HISTORY_START_TIME_FIELD_NUMBER: _ClassVar[int]
    HISTORY_END_TIME_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    registrations: _containers.RepeatedCompositeFieldContainer[Registration]
    history_start_time: _timestamp_pb2.Timestamp
    history_end_time: _timestamp_pb2.Timestamp
    next_page_token: str
    def __init__(self, registrations: _Optional[_Iterable[_Union[Registration, _Mapping]]] = ..., history_start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., history_end_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

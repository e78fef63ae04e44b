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

class PlanDecision(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PLAN_DECISION_UNSPECIFIED: _ClassVar[PlanDecision]
    PLAN_DECISION_PULL: _ClassVar[PlanDecision]
    PLAN_DECISION_RECOMPUTE: _ClassVar[PlanDecision]
    PLAN_DECISION_COLD: _ClassVar[PlanDecision]
    PLAN_DECISION_PREFILL_ON_DECODE: _ClassVar[PlanDecision]

class PlanReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PLAN_REASON_UNSPECIFIED: _ClassVar[PlanReason]
    PLAN_REASON_VERIFIED_PREFIX: _ClassVar[PlanReason]
    PLAN_REASON_NO_LEASE: _ClassVar[PlanReason]
    PLAN_REASON_BELOW_THRESHOLD: _ClassVar[PlanReason]
    PLAN_REASON_PREFIX_MISMATCH: _ClassVar[PlanReason]
    PLAN_REASON_EXPIRING: _ClassVar[PlanReason]
    PLAN_REASON_ENGINE_UNAVAILABLE: _ClassVar[PlanReason]
    PLAN_REASON_CONTROL_PLANE_DEGRADED: _ClassVar[PlanReason]
    PLAN_REASON_ALREADY_CLAIMED: _ClassVar[PlanReason]
    PLAN_REASON_BLOCK_SIZE_MISMATCH: _ClassVar[PlanReason]
    PLAN_REASON_NO_CONVERSATION: _ClassVar[PlanReason]
    PLAN_REASON_LEASE_RELEASED: _ClassVar[PlanReason]
    PLAN_REASON_RECOMPUTE_FASTER: _ClassVar[PlanReason]
    PLAN_REASON_TURN_STARTED: _ClassVar[PlanReason]

class HandleUse(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    HANDLE_USE_UNSPECIFIED: _ClassVar[HandleUse]
    HANDLE_USE_READ: _ClassVar[HandleUse]
    HANDLE_USE_NOT_READ: _ClassVar[HandleUse]
    HANDLE_USE_UNKNOWN: _ClassVar[HandleUse]

class RetentionOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RETENTION_OUTCOME_UNSPECIFIED: _ClassVar[RetentionOutcome]
    RETENTION_OUTCOME_REGISTERED: _ClassVar[RetentionOutcome]
    RETENTION_OUTCOME_ALREADY_REGISTERED: _ClassVar[RetentionOutcome]
    RETENTION_OUTCOME_NOT_RETAINED: _ClassVar[RetentionOutcome]
    RETENTION_OUTCOME_REJECTED: _ClassVar[RetentionOutcome]
    RETENTION_OUTCOME_NO_CONVERSATION: _ClassVar[RetentionOutcome]

class EngineSource(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ENGINE_SOURCE_UNSPECIFIED: _ClassVar[EngineSource]
    ENGINE_SOURCE_REGISTRY: _ClassVar[EngineSource]
    ENGINE_SOURCE_STATIC: _ClassVar[EngineSource]
PLAN_DECISION_UNSPECIFIED: PlanDecision
PLAN_DECISION_PULL: PlanDecision
PLAN_DECISION_RECOMPUTE: PlanDecision
PLAN_DECISION_COLD: PlanDecision
PLAN_DECISION_PREFILL_ON_DECODE: PlanDecision
PLAN_REASON_UNSPECIFIED: PlanReason
PLAN_REASON_VERIFIED_PREFIX: PlanReason
PLAN_REASON_NO_LEASE: PlanReason
PLAN_REASON_BELOW_THRESHOLD: PlanReason
PLAN_REASON_PREFIX_MISMATCH: PlanReason
PLAN_REASON_EXPIRING: PlanReason
PLAN_REASON_ENGINE_UNAVAILABLE: PlanReason
PLAN_REASON_CONTROL_PLANE_DEGRADED: PlanReason
PLAN_REASON_ALREADY_CLAIMED: PlanReason
PLAN_REASON_BLOCK_SIZE_MISMATCH: PlanReason
PLAN_REASON_NO_CONVERSATION: PlanReason
PLAN_REASON_LEASE_RELEASED: PlanReason
PLAN_REASON_RECOMPUTE_FASTER: PlanReason
PLAN_REASON_TURN_STARTED: PlanReason
HANDLE_USE_UNSPECIFIED: HandleUse
HANDLE_USE_READ: HandleUse
HANDLE_USE_NOT_READ: HandleUse
HANDLE_USE_UNKNOWN: HandleUse
RETENTION_OUTCOME_UNSPECIFIED: RetentionOutcome
RETENTION_OUTCOME_REGISTERED: RetentionOutcome
RETENTION_OUTCOME_ALREADY_REGISTERED: RetentionOutcome
RETENTION_OUTCOME_NOT_RETAINED: RetentionOutcome
RETENTION_OUTCOME_REJECTED: RetentionOutcome
RETENTION_OUTCOME_NO_CONVERSATION: RetentionOutcome
ENGINE_SOURCE_UNSPECIFIED: EngineSource
ENGINE_SOURCE_REGISTRY: EngineSource
ENGINE_SOURCE_STATIC: EngineSource

class PlannedEngine(_message.Message):
    __slots__ = ("engine_id", "http_base_url")
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    HTTP_BASE_URL_FIELD_NUMBER: _ClassVar[int]
    engine_id: str
    http_base_url: str
    def __init__(self, engine_id: _Optional[str] = ..., http_base_url: _Optional[str] = ...) -> None: ...

class PlanTurnRequest(_message.Message):
    __slots__ = ("tenant", "conversation_id", "model", "prompt_token_ids", "prompt_chain", "num_prompt_tokens", "request_id", "cache_salt", "prefill_cached_tokens", "can_prefill_on_decode", "prefill_engine_id", "turn_started")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_CHAIN_FIELD_NUMBER: _ClassVar[int]
    NUM_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CACHE_SALT_FIELD_NUMBER: _ClassVar[int]
    PREFILL_CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CAN_PREFILL_ON_DECODE_FIELD_NUMBER: _ClassVar[int]
    PREFILL_ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    TURN_STARTED_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    conversation_id: str
    model: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    prompt_chain: _types_pb2.TokenChain
    num_prompt_tokens: int
    request_id: str
    cache_salt: str
    prefill_cached_tokens: int
    can_prefill_on_decode: bool
    prefill_engine_id: str
    turn_started: bool
    def __init__(self, tenant: _Optional[str] = ..., conversation_id: _Optional[str] = ..., model: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., prompt_chain: _Optional[_Union[_types_pb2.TokenChain, _Mapping]] = ..., num_prompt_tokens: _Optional[int] = ..., request_id: _Optional[str] = ..., cache_salt: _Optional[str] = ..., prefill_cached_tokens: _Optional[int] = ..., can_prefill_on_decode: _Optional[bool] = ..., prefill_engine_id: _Optional[str] = ..., turn_started: _Optional[bool] = ...) -> None: ...

class PlanTurnResponse(_message.Message):
    __slots__ = ("plan_id", "decision", "reason", "prefill_engine", "decode_engine", "reusable_tokens", "recompute_tokens", "verified_prefix_tokens", "kv_transfer_params", "kv_transfer_params_json", "lease_id", "claim_id", "source_engine_id", "kv_recompute_threshold")
    PLAN_ID_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    PREFILL_ENGINE_FIELD_NUMBER: _ClassVar[int]
    DECODE_ENGINE_FIELD_NUMBER: _ClassVar[int]
    REUSABLE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RECOMPUTE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    VERIFIED_PREFIX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    KV_TRANSFER_PARAMS_FIELD_NUMBER: _ClassVar[int]
    KV_TRANSFER_PARAMS_JSON_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    CLAIM_ID_FIELD_NUMBER: _ClassVar[int]
    SOURCE_ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    KV_RECOMPUTE_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    plan_id: str
    decision: PlanDecision
    reason: PlanReason
    prefill_engine: PlannedEngine
    decode_engine: PlannedEngine
    reusable_tokens: int
    recompute_tokens: int
    verified_prefix_tokens: int
    kv_transfer_params: _types_pb2.KvTransferParams
    kv_transfer_params_json: str
    lease_id: str
    claim_id: str
    source_engine_id: str
    kv_recompute_threshold: int
    def __init__(self, plan_id: _Optional[str] = ..., decision: _Optional[_Union[PlanDecision, str]] = ..., reason: _Optional[_Union[PlanReason, str]] = ..., prefill_engine: _Optional[_Union[PlannedEngine, _Mapping]] = ..., decode_engine: _Optional[_Union[PlannedEngine, _Mapping]] = ..., reusable_tokens: _Optional[int] = ..., recompute_tokens: _Optional[int] = ..., verified_prefix_tokens: _Optional[int] = ..., kv_transfer_params: _Optional[_Union[_types_pb2.KvTransferParams, _Mapping]] = ..., kv_transfer_params_json: _Optional[str] = ..., lease_id: _Optional[str] = ..., claim_id: _Optional[str] = ..., source_engine_id: _Optional[str] = ..., kv_recompute_threshold: _Optional[int] = ...) -> None: ...

class ReportTurnRequest(_message.Message):
    __slots__ = ("tenant", "plan_id", "handle_use", "decode_kv_transfer_params", "decode_kv_transfer_params_json", "prompt_token_ids", "output_token_ids", "sequence_chain", "finish_time_unix", "conversation_id", "request_id", "delivered_cached_tokens", "cache_salt", "prefill_seconds", "copy_seconds", "inter_token_seconds", "decode_first_token_seconds")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    PLAN_ID_FIELD_NUMBER: _ClassVar[int]
    HANDLE_USE_FIELD_NUMBER: _ClassVar[int]
    DECODE_KV_TRANSFER_PARAMS_FIELD_NUMBER: _ClassVar[int]
    DECODE_KV_TRANSFER_PARAMS_JSON_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_CHAIN_FIELD_NUMBER: _ClassVar[int]
    FINISH_TIME_UNIX_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    DELIVERED_CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHE_SALT_FIELD_NUMBER: _ClassVar[int]
    PREFILL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    COPY_SECONDS_FIELD_NUMBER: _ClassVar[int]
    INTER_TOKEN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    DECODE_FIRST_TOKEN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    plan_id: str
    handle_use: HandleUse
    decode_kv_transfer_params: _types_pb2.KvTransferParams
    decode_kv_transfer_params_json: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    output_token_ids: _containers.RepeatedScalarFieldContainer[int]
    sequence_chain: _types_pb2.TokenChain
    finish_time_unix: float
    conversation_id: str
    request_id: str
    delivered_cached_tokens: int
    cache_salt: str
    prefill_seconds: float
    copy_seconds: float
    inter_token_seconds: float
    decode_first_token_seconds: float
    def __init__(self, tenant: _Optional[str] = ..., plan_id: _Optional[str] = ..., handle_use: _Optional[_Union[HandleUse, str]] = ..., decode_kv_transfer_params: _Optional[_Union[_types_pb2.KvTransferParams, _Mapping]] = ..., decode_kv_transfer_params_json: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., output_token_ids: _Optional[_Iterable[int]] = ..., sequence_chain: _Optional[_Union[_types_pb2.TokenChain, _Mapping]] = ..., finish_time_unix: _Optional[float] = ..., conversation_id: _Optional[str] = ..., request_id: _Optional[str] = ..., delivered_cached_tokens: _Optional[int] = ..., cache_salt: _Optional[str] = ..., prefill_seconds: _Optional[float] = ..., copy_seconds: _Optional[float] = ..., inter_token_seconds: _Optional[float] = ..., decode_first_token_seconds: _Optional[float] = ...) -> None: ...

class ReportTurnResponse(_message.Message):
    __slots__ = ("plan_id", "claimed_lease_state", "retention", "lease", "retention_detail")
    PLAN_ID_FIELD_NUMBER: _ClassVar[int]
    CLAIMED_LEASE_STATE_FIELD_NUMBER: _ClassVar[int]
    RETENTION_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    RETENTION_DETAIL_FIELD_NUMBER: _ClassVar[int]
    plan_id: str
    claimed_lease_state: _types_pb2.LeaseState
    retention: RetentionOutcome
    lease: _types_pb2.Lease
    retention_detail: str
    def __init__(self, plan_id: _Optional[str] = ..., claimed_lease_state: _Optional[_Union[_types_pb2.LeaseState, str]] = ..., retention: _Optional[_Union[RetentionOutcome, str]] = ..., lease: _Optional[_Union[_types_pb2.Lease, _Mapping]] = ..., retention_detail: _Optional[str] = ...) -> None: ...

class ReportTurnBatchRequest(_message.Message):
    __slots__ = ("reports",)
    REPORTS_FIELD_NUMBER: _ClassVar[int]
    reports: _containers.RepeatedCompositeFieldContainer[ReportTurnRequest]
    def __init__(self, reports: _Optional[_Iterable[_Union[ReportTurnRequest, _Mapping]]] = ...) -> None: ...

class ReportTurnBatchResult(_message.Message):
    __slots__ = ("response", "error_code", "error_reason", "error_message")
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_REASON_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    response: ReportTurnResponse
    error_code: int
    error_reason: str
    error_message: str
    def __init__(self, response: _Optional[_Union[ReportTurnResponse, _Mapping]] = ..., error_code: _Optional[int] = ..., error_reason: _Optional[str] = ..., error_message: _Optional[str] = ...) -> None: ...

class ReportTurnBatchResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[ReportTurnBatchResult]
    def __init__(self, results: _Optional[_Iterable[_Union[ReportTurnBatchResult, _Mapping]]] = ...) -> None: ...

class TurnPlan(_message.Message):
    __slots__ = ("plan_id", "tenant", "conversation_id", "model", "decision", "reason", "prefill_engine", "decode_engine", "source_engine_id", "lease_id", "claim_id", "prompt_tokens", "reusable_tokens", "recompute_tokens", "verified_prefix_tokens", "create_time", "report_time", "handle_use", "claimed_lease_state", "retention", "new_lease_id", "outcome_detail", "outcome", "delivered_cached_tokens")
    PLAN_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    PREFILL_ENGINE_FIELD_NUMBER: _ClassVar[int]
    DECODE_ENGINE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    CLAIM_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REUSABLE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RECOMPUTE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    VERIFIED_PREFIX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    REPORT_TIME_FIELD_NUMBER: _ClassVar[int]
    HANDLE_USE_FIELD_NUMBER: _ClassVar[int]
    CLAIMED_LEASE_STATE_FIELD_NUMBER: _ClassVar[int]
    RETENTION_FIELD_NUMBER: _ClassVar[int]
    NEW_LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_DETAIL_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    DELIVERED_CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    plan_id: str
    tenant: str
    conversation_id: str
    model: str
    decision: PlanDecision
    reason: PlanReason
    prefill_engine: PlannedEngine
    decode_engine: PlannedEngine
    source_engine_id: str
    lease_id: str
    claim_id: str
    prompt_tokens: int
    reusable_tokens: int
    recompute_tokens: int
    verified_prefix_tokens: int
    create_time: _timestamp_pb2.Timestamp
    report_time: _timestamp_pb2.Timestamp
    handle_use: HandleUse
    claimed_lease_state: _types_pb2.LeaseState
    retention: RetentionOutcome
    new_lease_id: str
    outcome_detail: str
    outcome: str
    delivered_cached_tokens: int
    def __init__(self, plan_id: _Optional[str] = ..., tenant: _Optional[str] = ..., conversation_id: _Optional[str] = ..., model: _Optional[str] = ..., decision: _Optional[_Union[PlanDecision, str]] = ..., reason: _Optional[_Union[PlanReason, str]] = ..., prefill_engine: _Optional[_Union[PlannedEngine, _Mapping]] = ..., decode_engine: _Optional[_Union[PlannedEngine, _Mapping]] = ..., source_engine_id: _Optional[str] = ..., lease_id: _Optional[str] = ..., claim_id: _Optional[str] = ..., prompt_tokens: _Optional[int] = ..., reusable_tokens: _Optional[int] = ..., recompute_tokens: _Optional[int] = ..., verified_prefix_tokens: _Optional[int] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., report_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., handle_use: _Optional[_Union[HandleUse, str]] = ..., claimed_lease_state: _Optional[_Union[_types_pb2.LeaseState, str]] = ..., retention: _Optional[_Union[RetentionOutcome, str]] = ..., new_lease_id: _Optional[str] = ..., outcome_detail: _Optional[str] = ..., outcome: _Optional[str] = ..., delivered_cached_tokens: _Optional[int] = ...) -> None: ...

class GetTurnPlanRequest(_message.Message):
    __slots__ = ("tenant", "plan_id")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    PLAN_ID_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    plan_id: str
    def __init__(self, tenant: _Optional[str] = ..., plan_id: _Optional[str] = ...) -> None: ...

class GetTurnPlanResponse(_message.Message):
    __slots__ = ("plan",)
    PLAN_FIELD_NUMBER: _ClassVar[int]
    plan: TurnPlan
    def __init__(self, plan: _Optional[_Union[TurnPlan, _Mapping]] = ...) -> None: ...

class ListTurnPlansRequest(_message.Message):
    __slots__ = ("tenant", "conversation_id", "page_size", "page_token")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    conversation_id: str
    page_size: int
    page_token: str
    def __init__(self, tenant: _Optional[str] = ..., conversation_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListTurnPlansResponse(_message.Message):
    __slots__ = ("plans", "next_page_token")
    PLANS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    plans: _containers.RepeatedCompositeFieldContainer[TurnPlan]
    next_page_token: str
    def __init__(self, plans: _Optional[_Iterable[_Union[TurnPlan, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class RouterServiceListEnginesRequest(_message.Message):
    __slots__ = ("model", "role")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    model: str
    role: _types_pb2.EngineRole
    def __init__(self, model: _Optional[str] = ..., role: _Optional[_Union[_types_pb2.EngineRole, str]] = ...) -> None: ...

class PoolEngine(_message.Message):
    __slots__ = ("engine", "source", "available", "unavailable_reason", "planned_turns", "planned_prompt_tokens", "load", "prefill_cost", "copy_costs", "inter_token_ms", "first_step_ms")
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    UNAVAILABLE_REASON_FIELD_NUMBER: _ClassVar[int]
    PLANNED_TURNS_FIELD_NUMBER: _ClassVar[int]
    PLANNED_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    PREFILL_COST_FIELD_NUMBER: _ClassVar[int]
    COPY_COSTS_FIELD_NUMBER: _ClassVar[int]
    INTER_TOKEN_MS_FIELD_NUMBER: _ClassVar[int]
    FIRST_STEP_MS_FIELD_NUMBER: _ClassVar[int]
    engine: _types_pb2.Engine
    source: EngineSource
    available: bool
    unavailable_reason: str
    planned_turns: int
    planned_prompt_tokens: int
    load: float
    prefill_cost: PrefillCost
    copy_costs: _containers.RepeatedCompositeFieldContainer[CopyCost]
    inter_token_ms: float
    first_step_ms: float
    def __init__(self, engine: _Optional[_Union[_types_pb2.Engine, _Mapping]] = ..., source: _Optional[_Union[EngineSource, str]] = ..., available: _Optional[bool] = ..., unavailable_reason: _Optional[str] = ..., planned_turns: _Optional[int] = ..., planned_prompt_tokens: _Optional[int] = ..., load: _Optional[float] = ..., prefill_cost: _Optional[_Union[PrefillCost, _Mapping]] = ..., copy_costs: _Optional[_Iterable[_Union[CopyCost, _Mapping]]] = ..., inter_token_ms: _Optional[float] = ..., first_step_ms: _Optional[float] = ...) -> None: ...

class PrefillCost(_message.Message):
    __slots__ = ("floor_ms", "token_ms", "attention_ms", "context_ms", "observations")
    FLOOR_MS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_MS_FIELD_NUMBER: _ClassVar[int]
    ATTENTION_MS_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_MS_FIELD_NUMBER: _ClassVar[int]
    OBSERVATIONS_FIELD_NUMBER: _ClassVar[int]
    floor_ms: float
    token_ms: float
    attention_ms: float
    context_ms: float
    observations: int
    def __init__(self, floor_ms: _Optional[float] = ..., token_ms: _Optional[float] = ..., attention_ms: _Optional[float] = ..., context_ms: _Optional[float] = ..., observations: _Optional[int] = ...) -> None: ...

class CopyCost(_message.Message):
    __slots__ = ("source_engine_id", "fixed_ms", "token_ms", "observations")
    SOURCE_ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    FIXED_MS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_MS_FIELD_NUMBER: _ClassVar[int]
    OBSERVATIONS_FIELD_NUMBER: _ClassVar[int]
    source_engine_id: str
    fixed_ms: float
    token_ms: float
    observations: int
    def __init__(self, source_engine_id: _Optional[str] = ..., fixed_ms: _Optional[float] = ..., token_ms: _Optional[float] = ..., observations: _Optional[int] = ...) -> None: ...

class RouterServiceListEnginesResponse(_message.Message):
    __slots__ = ("engines",)
    ENGINES_FIELD_NUMBER: _ClassVar[int]
    engines: _containers.RepeatedCompositeFieldContainer[PoolEngine]
    def __init__(self, engines: _Optional[_Iterable[_Union[PoolEngine, _Mapping]]] = ...) -> None: ...

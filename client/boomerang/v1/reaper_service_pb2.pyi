import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class LagSummary(_message.Message):
    __slots__ = ("count", "p50_seconds", "p99_seconds", "max_seconds")
    COUNT_FIELD_NUMBER: _ClassVar[int]
    P50_SECONDS_FIELD_NUMBER: _ClassVar[int]
    P99_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MAX_SECONDS_FIELD_NUMBER: _ClassVar[int]
    count: int
    p50_seconds: float
    p99_seconds: float
    max_seconds: float
    def __init__(self, count: _Optional[int] = ..., p50_seconds: _Optional[float] = ..., p99_seconds: _Optional[float] = ..., max_seconds: _Optional[float] = ...) -> None: ...

class TTLReaperServiceGetStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TTLReaperServiceGetStatusResponse(_message.Message):
    __slots__ = ("replica_id", "leader", "leader_replica_id", "term", "leader_expire_time", "next_expire_time", "backlog_leases", "live_leases", "expiry_lag", "expired_leases", "invalidated_leases", "dropped_partitions", "last_expire_time", "database_time")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    LEADER_REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    LEADER_EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    NEXT_EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    BACKLOG_LEASES_FIELD_NUMBER: _ClassVar[int]
    LIVE_LEASES_FIELD_NUMBER: _ClassVar[int]
    EXPIRY_LAG_FIELD_NUMBER: _ClassVar[int]
    EXPIRED_LEASES_FIELD_NUMBER: _ClassVar[int]
    INVALIDATED_LEASES_FIELD_NUMBER: _ClassVar[int]
    DROPPED_PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    LAST_EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    DATABASE_TIME_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    leader: bool
    leader_replica_id: str
    term: int
    leader_expire_time: _timestamp_pb2.Timestamp
    next_expire_time: _timestamp_pb2.Timestamp
    backlog_leases: int
    live_leases: int
    expiry_lag: LagSummary
    expired_leases: int
    invalidated_leases: int
    dropped_partitions: int
    last_expire_time: _timestamp_pb2.Timestamp
    database_time: _timestamp_pb2.Timestamp
    def __init__(self, replica_id: _Optional[str] = ..., leader: _Optional[bool] = ..., leader_replica_id: _Optional[str] = ..., term: _Optional[int] = ..., leader_expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., next_expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., backlog_leases: _Optional[int] = ..., live_leases: _Optional[int] = ..., expiry_lag: _Optional[_Union[LagSummary, _Mapping]] = ..., expired_leases: _Optional[int] = ..., invalidated_leases: _Optional[int] = ..., dropped_partitions: _Optional[int] = ..., last_expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., database_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ReapNowRequest(_message.Message):
    __slots__ = ("sweep_engines", "enforce_retention", "request_id")
    SWEEP_ENGINES_FIELD_NUMBER: _ClassVar[int]
    ENFORCE_RETENTION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    sweep_engines: bool
    enforce_retention: bool
    request_id: str
    def __init__(self, sweep_engines: _Optional[bool] = ..., enforce_retention: _Optional[bool] = ..., request_id: _Optional[str] = ...) -> None: ...

class ReapNowResponse(_message.Message):
    __slots__ = ("term", "expired_leases", "expiry_lag", "invalidated_leases", "dead_engine_ids", "dropped_partitions")
    TERM_FIELD_NUMBER: _ClassVar[int]
    EXPIRED_LEASES_FIELD_NUMBER: _ClassVar[int]
    EXPIRY_LAG_FIELD_NUMBER: _ClassVar[int]
    INVALIDATED_LEASES_FIELD_NUMBER: _ClassVar[int]
    DEAD_ENGINE_IDS_FIELD_NUMBER: _ClassVar[int]
    DROPPED_PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    term: int
    expired_leases: int
    expiry_lag: LagSummary
    invalidated_leases: int
    dead_engine_ids: _containers.RepeatedScalarFieldContainer[str]
    dropped_partitions: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, term: _Optional[int] = ..., expired_leases: _Optional[int] = ..., expiry_lag: _Optional[_Union[LagSummary, _Mapping]] = ..., invalidated_leases: _Optional[int] = ..., dead_engine_ids: _Optional[_Iterable[str]] = ..., dropped_partitions: _Optional[_Iterable[str]] = ...) -> None: ...

class AdviseTTLRequest(_message.Message):
    __slots__ = ("tenant", "model", "target_reuse", "history_hours", "candidate_ttl_seconds", "safety_seconds")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TARGET_REUSE_FIELD_NUMBER: _ClassVar[int]
    HISTORY_HOURS_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SAFETY_SECONDS_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    model: str
    target_reuse: float
    history_hours: float
    candidate_ttl_seconds: _containers.RepeatedScalarFieldContainer[int]
    safety_seconds: float
    def __init__(self, tenant: _Optional[str] = ..., model: _Optional[str] = ..., target_reuse: _Optional[float] = ..., history_hours: _Optional[float] = ..., candidate_ttl_seconds: _Optional[_Iterable[int]] = ..., safety_seconds: _Optional[float] = ...) -> None: ...

class PausePercentile(_message.Message):
    __slots__ = ("percentile", "seconds")
    PERCENTILE_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    percentile: float
    seconds: float
    def __init__(self, percentile: _Optional[float] = ..., seconds: _Optional[float] = ...) -> None: ...

class TtlCandidate(_message.Message):
    __slots__ = ("ttl_seconds", "reuse_share", "block_seconds", "byte_seconds", "mean_resident_blocks", "mean_resident_bytes", "recommended", "current")
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    REUSE_SHARE_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SECONDS_FIELD_NUMBER: _ClassVar[int]
    BYTE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MEAN_RESIDENT_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    MEAN_RESIDENT_BYTES_FIELD_NUMBER: _ClassVar[int]
    RECOMMENDED_FIELD_NUMBER: _ClassVar[int]
    CURRENT_FIELD_NUMBER: _ClassVar[int]
    ttl_seconds: int
    reuse_share: float
    block_seconds: float
    byte_seconds: float
    mean_resident_blocks: float
    mean_resident_bytes: float
    recommended: bool
    current: bool
    def __init__(self, ttl_seconds: _Optional[int] = ..., reuse_share: _Optional[float] = ..., block_seconds: _Optional[float] = ..., byte_seconds: _Optional[float] = ..., mean_resident_blocks: _Optional[float] = ..., mean_resident_bytes: _Optional[float] = ..., recommended: _Optional[bool] = ..., current: _Optional[bool] = ...) -> None: ...

class TtlAdvice(_message.Message):
    __slots__ = ("tenant", "model", "turns", "next_turns", "exact_pauses", "pause_percentiles", "candidates", "recommended_ttl_seconds", "current_ttl_seconds", "bytes_known_share")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TURNS_FIELD_NUMBER: _ClassVar[int]
    NEXT_TURNS_FIELD_NUMBER: _ClassVar[int]
    EXACT_PAUSES_FIELD_NUMBER: _ClassVar[int]
    PAUSE_PERCENTILES_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    RECOMMENDED_TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CURRENT_TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    BYTES_KNOWN_SHARE_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    model: str
    turns: int
    next_turns: int
    exact_pauses: int
    pause_percentiles: _containers.RepeatedCompositeFieldContainer[PausePercentile]
    candidates: _containers.RepeatedCompositeFieldContainer[TtlCandidate]
    recommended_ttl_seconds: int
    current_ttl_seconds: int
    bytes_known_share: float
    def __init__(self, tenant: _Optional[str] = ..., model: _Optional[str] = ..., turns: _Optional[int] = ..., next_turns: _Optional[int] = ..., exact_pauses: _Optional[int] = ..., pause_percentiles: _Optional[_Iterable[_Union[PausePercentile, _Mapping]]] = ..., candidates: _Optional[_Iterable[_Union[TtlCandidate, _Mapping]]] = ..., recommended_ttl_seconds: _Optional[int] = ..., current_ttl_seconds: _Optional[int] = ..., bytes_known_share: _Optional[float] = ...) -> None: ...

class AdviseTTLResponse(_message.Message):
    __slots__ = ("advice", "history_start_time", "history_end_time", "target_reuse", "safety_seconds")
    ADVICE_FIELD_NUMBER: _ClassVar[int]
    HISTORY_START_TIME_FIELD_NUMBER: _ClassVar[int]
    HISTORY_END_TIME_FIELD_NUMBER: _ClassVar[int]
    TARGET_REUSE_FIELD_NUMBER: _ClassVar[int]
    SAFETY_SECONDS_FIELD_NUMBER: _ClassVar[int]
    advice: _containers.RepeatedCompositeFieldContainer[TtlAdvice]
    history_start_time: _timestamp_pb2.Timestamp
    history_end_time: _timestamp_pb2.Timestamp
    target_reuse: float
    safety_seconds: float
    def __init__(self, advice: _Optional[_Iterable[_Union[TtlAdvice, _Mapping]]] = ..., history_start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., history_end_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., target_reuse: _Optional[float] = ..., safety_seconds: _Optional[float] = ...) -> None: ...

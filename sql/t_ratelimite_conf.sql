-- gateway-limiter schema for MySQL / MariaDB: the same tables the Alembic history
-- (gateway-limiter db upgrade) creates. Prefer the migration: it also records the
-- revision, so later upgrades know where to start.

create table t_ratelimite_conf (
    configId       INT(11)              NOT NULL AUTO_INCREMENT,
    channelType    VARCHAR(24)          NULL,     -- supplier, e.g. IBE+
    interfaceNo    VARCHAR(24)          NULL,     -- supplier's interface number
    interfaceUrl   VARCHAR(128)         NULL,     -- bucket name; also part of the Redis key
    rateLimit      INT(11)              NULL,     -- permits per periodSeconds (1 s unless that column says more)
    cache          FLOAT(3, 2)          NULL,     -- wait budget in seconds (0.5 = may wait 500 ms)
    status         TINYINT(1) DEFAULT 0 NOT NULL, -- 0 disabled, 1 enabled
    lastModifyTime datetime   DEFAULT CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP,
    PRIMARY KEY (`configId`)
);

-- Revision 0003: how strictly each interface is limited (docs/algorithms.md).
alter table t_ratelimite_conf
    add column algorithm    VARCHAR(16) NULL DEFAULT 'token_bucket', -- token_bucket, warm_up, sliding_window, fixed_window
    add column maxPermits   INT(11)     NULL,  -- token_bucket capacity; NULL = rateLimit
    add column warmupPeriod FLOAT       NULL;  -- warm_up: seconds from cold to the full rate

-- Revision 0004: several limits per interface, and limits per caller (docs/algorithms.md).
alter table t_ratelimite_conf
    add column periodSeconds INT(11)    NOT NULL DEFAULT 1, -- rateLimit permits per this many seconds
    add column perCaller     TINYINT(1) NOT NULL DEFAULT 0; -- 1: each caller key has its own bucket
-- Revision 0005: shadow mode. 1 = decide and count as usual, but always admit the call
-- (a new limit on trial: refusals it would make are counted and logged, not enforced).
alter table t_ratelimite_conf
    add column shadow TINYINT(1) NOT NULL DEFAULT 0;

-- Revision 0006: calls in flight, named callers (docs/design.md, "The table").
alter table t_ratelimite_conf
    add column maxConcurrent INT(11)     NULL,  -- at most this many calls in flight, fleet-wide; NULL = no limit
    add column callerKey     VARCHAR(64) NULL;  -- perCaller rows: this caller alone; NULL = every other caller

-- Revision 0007: leases for hot interfaces (docs/algorithms.md, "Leases").
alter table t_ratelimite_conf
    add column leaseMs INT(11) NULL;  -- ms of the rate one process takes per round trip; NULL/0 = off

-- Revision 0008: the text that identifies a row compares byte for byte, as the limiter
-- compares it (no case, accent or trailing-space folding). MariaDB's collation; on
-- MySQL 8 write utf8mb4_0900_bin, on MySQL 5.7 utf8mb4_bin.
alter table t_ratelimite_conf
    modify interfaceUrl VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NULL,
    modify channelType  VARCHAR(24)  CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NULL,
    modify callerKey    VARCHAR(64)  CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NULL;

-- Revision 0009: calendar quotas (docs/algorithms.md, "Calendar quotas").
alter table t_ratelimite_conf
    add column quotaPeriod VARCHAR(8)  NULL,               -- day, week or month: rateLimit per period; NULL = per periodSeconds
    add column timeZone    VARCHAR(64) NULL,               -- IANA zone of the calendar; NULL = the default_time_zone setting
    add column quotaRenews VARCHAR(16) NULL,               -- local turnover: 02:00, mon 00:00, 15 00:00; NULL = midnight, Monday, the 1st
    add column quotaPacing TINYINT(1)  NOT NULL DEFAULT 0; -- 1: spread what is left over what is left of the period

-- Revision 0010: priority classes (docs/priority.md).
alter table t_ratelimite_conf
    add column priority VARCHAR(16)  NULL,  -- class of the interface's calls: critical, default, sheddable_plus, sheddable; NULL = default
    add column reserve  VARCHAR(128) NULL;  -- share each class leaves for those above: default=0.1,sheddable_plus=0.3,sheddable=0.5; NULL = none

-- Every change to a limit or the switch: through the command line or the console,
-- or found by the reload after plain SQL (source = 'sql').
create table t_ratelimite_audit (
    auditId   BIGINT       NOT NULL AUTO_INCREMENT,
    changedAt datetime     NOT NULL DEFAULT CURRENT_TIMESTAMP,
    actor     VARCHAR(128) NOT NULL,  -- who: user@host, or the console's caller
    source    VARCHAR(16)  NOT NULL,  -- cli, console or sql
    configId  INT(11)      NULL,      -- the row changed; NULL for the switch
    action    VARCHAR(16)  NOT NULL,  -- insert, update, delete or switch
    beforeRow TEXT         NULL,      -- the row before, as JSON
    afterRow  TEXT         NULL,      -- the row after, as JSON
    PRIMARY KEY (`auditId`),
    KEY `ix_t_ratelimite_audit_changedAt` (`changedAt`)
);

-- The global switch: one row. enabled NULL = follow the `switch` setting,
-- 1 = limiting on, 0 = limiting off for every process at its next reload.
create table t_ratelimite_switch (
    switchId       INT(11)    NOT NULL,
    enabled        TINYINT(1) NULL,
    lastModifyTime datetime   DEFAULT CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP,
    PRIMARY KEY (`switchId`)
);
insert into t_ratelimite_switch (switchId, enabled) values (1, NULL);

-- Calendar quotas' counters, checkpointed (revision 0011): one row per counter, written
-- at most every quota_checkpoint_s by the process holding the counter's lock, so that a
-- Redis that comes back without a counter resumes from its last count.
create table t_ratelimite_quota (
    counterId   VARCHAR(40)  NOT NULL,  -- SHA1 of counterKey
    counterKey  VARCHAR(512) NOT NULL,  -- the counter's Redis key
    periodStart BIGINT       NOT NULL,  -- start of the period counted, epoch microseconds
    used        BIGINT       NOT NULL,  -- permits counted in that period
    savedAt     datetime     NOT NULL DEFAULT CURRENT_TIMESTAMP,
    PRIMARY KEY (`counterId`)
);

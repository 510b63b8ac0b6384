/*
 * pgplane_limits: the branch size limit, enforced inside Postgres as Neon enforces it.
 *
 * Neon refuses to extend a relation file once the branch's logical size has reached
 * neon.max_cluster_size. Vanilla Postgres has no hook at that level, so this library refuses,
 * at the executor and utility hooks, the statements that add data: the same error (SQLSTATE
 * 53100, disk_full), the same message, while reads, DELETE, TRUNCATE, DROP and plain VACUUM
 * go on, so a tenant can always free space. Temporary relations are exempt, as on Neon.
 *
 * Refused once the limit is reached (see statement_adds_data and utility_adds_data):
 *   INSERT, UPDATE, MERGE (unless its every action deletes or does nothing), and any plan with
 *   a data-modifying CTE that inserts or updates, unless every target is temporary;
 *   COPY ... FROM; CREATE TABLE AS / SELECT INTO and CREATE MATERIALIZED VIEW (not WITH NO
 *   DATA); REFRESH MATERIALIZED VIEW (not WITH NO DATA); CREATE INDEX; REINDEX; CLUSTER;
 *   VACUUM FULL; CREATE DATABASE; EXPLAIN ANALYZE of any of these.
 * Never refused: SELECT, DELETE, TRUNCATE, DROP, VACUUM, ANALYZE, DDL that adds no rows, roles
 * and grants. Not refused, though they can add data: large objects (lo_import, lowrite) and
 * ALTER TABLE that rewrites its table or builds an index.
 *
 * The size is what pg_database_size adds up: the regular files under base/ and global/ of
 * this cluster's own data directory (the backend's working directory), stat'ed without
 * following links, recomputed at most once a second per backend and only for a statement
 * that would be refused. The limit is pgplane.max_cluster_size (MB), PGC_SIGHUP: set by the
 * platform in a file the tenant cannot write, changed with a reload, never by SET.
 *
 * Built by pgplane for each Postgres major it serves (13 to 18) and preloaded into every
 * compute (shared_preload_libraries on the postmaster's command line).
 */
#include "postgres.h"

#include <limits.h>
#include <sys/stat.h>

#include "access/htup_details.h"
#include "catalog/namespace.h"
#include "catalog/pg_class.h"
#include "commands/defrem.h"
#include "executor/executor.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "nodes/parsenodes.h"
#include "nodes/plannodes.h"
#include "parser/parsetree.h"
#include "storage/fd.h"
#include "tcop/utility.h"
#include "utils/guc.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"

PG_MODULE_MAGIC;

/* In storage/fd.h from 16 on. */
#ifndef PG_TEMP_FILES_DIR
#define PG_TEMP_FILES_DIR "pgsql_tmp"
#endif

void		_PG_init(void);

/* The limit in MB; -1 (or 0) means none, as neon.max_cluster_size. */
static int	max_cluster_size = -1;

/* The size a second ago: statements that add data come in bursts, a walk of base/ costs. */
#define SIZE_CACHE_MS 1000
static uint64 cached_size = 0;
static TimestampTz cached_at = 0;

static ExecutorStart_hook_type prev_executor_start = NULL;
static ProcessUtility_hook_type prev_process_utility = NULL;

/*
 * Bytes of the regular files in a directory of the data directory (relative to it: the
 * backend runs there), and one level down when descend (base/<database oid>/). Links are never
 * followed: the tenant owns these files. A file dropped while we look is skipped.
 */
static uint64
directory_size(const char *path, bool descend)
{
	DIR		   *dir;
	struct dirent *de;
	uint64		total = 0;

	dir = AllocateDir(path);
	while ((de = ReadDirExtended(dir, path, DEBUG1)) != NULL)
	{
		char		child[MAXPGPATH];
		struct stat st;

		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		snprintf(child, sizeof(child), "%s/%s", path, de->d_name);
		if (lstat(child, &st) != 0)
			continue;
		if (S_ISREG(st.st_mode))
			total += (uint64) st.st_size;
		else if (descend && S_ISDIR(st.st_mode) && strcmp(de->d_name, PG_TEMP_FILES_DIR) != 0)
			total += directory_size(child, false);
	}
	if (dir != NULL)
		FreeDir(dir);
	return total;
}

static bool
limit_reached(void)
{
	TimestampTz now;

	if (max_cluster_size <= 0)
		return false;
	now = GetCurrentTimestamp();
	if (cached_at == 0 || TimestampDifferenceExceeds(cached_at, now, SIZE_CACHE_MS))
	{
		cached_size = directory_size("base", true) + directory_size("global", false);
		cached_at = now;
	}
	return cached_size >= (uint64) max_cluster_size * 1024 * 1024;
}

static void
refuse(void)
{
	ereport(ERROR,
			(errcode(ERRCODE_DISK_FULL),
			 errmsg("could not extend file because project size limit (%d MB) has been exceeded",
					max_cluster_size),
			 errhint("This limit is defined externally by the project size limit, and internally by pgplane.max_cluster_size GUC")));
}

/* Whether a relation is temporary; false for one that does not exist (any more). */
static bool
relation_is_temp(Oid relid)
{
	HeapTuple	tuple;
	bool		temp;

	if (!OidIsValid(relid))
		return false;
	tuple = SearchSysCache1(RELOID, ObjectIdGetDatum(relid));
	if (!HeapTupleIsValid(tuple))
		return false;
	temp = ((Form_pg_class) GETSTRUCT(tuple))->relpersistence == RELPERSISTENCE_TEMP;
	ReleaseSysCache(tuple);
	return temp;
}

static bool
rangevar_is_temp(RangeVar *relation)
{
	if (relation == NULL)
		return false;
	if (relation->relpersistence == RELPERSISTENCE_TEMP)
		return true;
	return relation_is_temp(RangeVarGetRelid(relation, NoLock, true));
}

/* Whether a ModifyTable node may add rows to a relation that is not temporary. */
static bool
modify_adds_data(ModifyTable *modify, List *rtable)
{
	ListCell   *lc;

	switch (modify->operation)
	{
		case CMD_INSERT:
		case CMD_UPDATE:
			break;
#if PG_VERSION_NUM >= 150000
		case CMD_MERGE:
			{
				bool		adds = false;
				ListCell   *lists;

				/* A MERGE whose every action deletes or does nothing frees space. */
				foreach(lists, modify->mergeActionLists)
				{
					ListCell   *la;

					foreach(la, (List *) lfirst(lists))
					{
						MergeAction *action = (MergeAction *) lfirst(la);

						if (action->commandType == CMD_INSERT ||
							action->commandType == CMD_UPDATE)
							adds = true;
					}
				}
				if (!adds)
					return false;
				break;
			}
#endif
		default:
			return false;
	}
	foreach(lc, modify->resultRelations)
	{
		RangeTblEntry *rte = rt_fetch(lfirst_int(lc), rtable);

		if (!relation_is_temp(rte->relid))
			return true;
	}
	return false;
}

static bool
statement_adds_data(PlannedStmt *stmt)
{
	ListCell   *lc;
	bool		adding = stmt->commandType == CMD_INSERT || stmt->commandType == CMD_UPDATE;

#if PG_VERSION_NUM >= 150000
	adding = adding || stmt->commandType == CMD_MERGE;
#endif
	if (!adding && !stmt->hasModifyingCTE)
		return false;
	/* ModifyTable sits at the top of the plan, and of each data-modifying CTE's subplan. */
	if (stmt->planTree != NULL && IsA(stmt->planTree, ModifyTable))
	{
		if (modify_adds_data((ModifyTable *) stmt->planTree, stmt->rtable))
			return true;
	}
	else if (adding)
	{
		/* Not the shape expected: judge by every target of the statement. */
		foreach(lc, stmt->resultRelations)
		{
			if (!relation_is_temp(rt_fetch(lfirst_int(lc), stmt->rtable)->relid))
				return true;
		}
	}
	foreach(lc, stmt->subplans)
	{
		Plan	   *plan = (Plan *) lfirst(lc);

		if (plan != NULL && IsA(plan, ModifyTable) &&
			modify_adds_data((ModifyTable *) plan, stmt->rtable))
			return true;
	}
	return false;
}

static void
limits_executor_start(QueryDesc *queryDesc, int eflags)
{
	if (!(eflags & EXEC_FLAG_EXPLAIN_ONLY) &&
		statement_adds_data(queryDesc->plannedstmt) && limit_reached())
		refuse();
	if (prev_executor_start)
		prev_executor_start(queryDesc, eflags);
	else
		standard_ExecutorStart(queryDesc, eflags);
}

static bool
option_set(List *options, const char *name)
{
	ListCell   *lc;

	foreach(lc, options)
	{
		DefElem    *opt = (DefElem *) lfirst(lc);

		if (strcmp(opt->defname, name) == 0)
			return defGetBoolean(opt);
	}
	return false;
}

static bool
utility_adds_data(Node *stmt)
{
	switch (nodeTag(stmt))
	{
		case T_CopyStmt:
			{
				CopyStmt   *copy = (CopyStmt *) stmt;

				return copy->is_from && !rangevar_is_temp(copy->relation);
			}
		case T_CreateTableAsStmt:
			{
				/* CREATE TABLE AS, SELECT INTO, CREATE MATERIALIZED VIEW */
				IntoClause *into = ((CreateTableAsStmt *) stmt)->into;

				return !into->skipData && !rangevar_is_temp(into->rel);
			}
		case T_RefreshMatViewStmt:
			return !((RefreshMatViewStmt *) stmt)->skipData;
		case T_IndexStmt:
			return !rangevar_is_temp(((IndexStmt *) stmt)->relation);
		case T_ReindexStmt:
			return !rangevar_is_temp(((ReindexStmt *) stmt)->relation);
		case T_ClusterStmt:
			return !rangevar_is_temp(((ClusterStmt *) stmt)->relation);
		case T_VacuumStmt:
			{
				VacuumStmt *vacuum = (VacuumStmt *) stmt;
				ListCell   *lc;

				/* VACUUM FULL rewrites each table beside the old one; plain VACUUM frees. */
				if (!vacuum->is_vacuumcmd || !option_set(vacuum->options, "full"))
					return false;
				if (vacuum->rels == NIL)
					return true;
				foreach(lc, vacuum->rels)
				{
					if (!rangevar_is_temp(((VacuumRelation *) lfirst(lc))->relation))
						return true;
				}
				return false;
			}
		case T_CreatedbStmt:
			return true;
		case T_ExplainStmt:
			{
				/* EXPLAIN ANALYZE CREATE TABLE AS runs it; other queries meet the executor. */
				ExplainStmt *explain = (ExplainStmt *) stmt;
				Query	   *query = (Query *) explain->query;

				return IsA(query, Query) && query->commandType == CMD_UTILITY &&
					query->utilityStmt != NULL && option_set(explain->options, "analyze") &&
					utility_adds_data(query->utilityStmt);
			}
		default:
			return false;
	}
}

#if PG_VERSION_NUM >= 140000
static void
limits_process_utility(PlannedStmt *pstmt, const char *queryString, bool readOnlyTree,
					   ProcessUtilityContext context, ParamListInfo params,
					   QueryEnvironment *queryEnv, DestReceiver *dest, QueryCompletion *qc)
{
	if (utility_adds_data(pstmt->utilityStmt) && limit_reached())
		refuse();
	if (prev_process_utility)
		prev_process_utility(pstmt, queryString, readOnlyTree, context, params, queryEnv,
							 dest, qc);
	else
		standard_ProcessUtility(pstmt, queryString, readOnlyTree, context, params, queryEnv,
								dest, qc);
}
#else
static void
limits_process_utility(PlannedStmt *pstmt, const char *queryString,
					   ProcessUtilityContext context, ParamListInfo params,
					   QueryEnvironment *queryEnv, DestReceiver *dest, QueryCompletion *qc)
{
	if (utility_adds_data(pstmt->utilityStmt) && limit_reached())
		refuse();
	if (prev_process_utility)
		prev_process_utility(pstmt, queryString, context, params, queryEnv, dest, qc);
	else
		standard_ProcessUtility(pstmt, queryString, context, params, queryEnv, dest, qc);
}
#endif

void
_PG_init(void)
{
	DefineCustomIntVariable("pgplane.max_cluster_size",
							"The branch's size limit: statements that add data are refused once its relations reach it.",
							"-1 means no limit. Set by the platform (pgplane's --branch-size-limit).",
							&max_cluster_size,
							-1, -1, INT_MAX,
							PGC_SIGHUP,
							GUC_UNIT_MB,
							NULL, NULL, NULL);
#if PG_VERSION_NUM >= 150000
	MarkGUCPrefixReserved("pgplane");
#else
	EmitWarningsOnPlaceholders("pgplane");
#endif
	prev_executor_start = ExecutorStart_hook;
	ExecutorStart_hook = limits_executor_start;
	prev_process_utility = ProcessUtility_hook;
	ProcessUtility_hook = limits_process_utility;
}

//! The conformance suite: every scenario runs on every backend (SQLite always; PostgreSQL when
//! `DOCKHAND_TEST_POSTGRES_URL` is set). Scenario ids from `shared/SCENARIOS.md` are in the
//! test names (`s_a1_…`).

mod harness;
mod scenarios;

conformance!(
    // Actions and runner (S-A1 … S-A11)
    s_a1_async_single_interval_cron_run_when_due_never_before,
    s_a1_cron_paris_nine_am_across_dst,
    s_a2_fifty_concurrent_unique_enqueues_make_one_row,
    s_a3_fails_twice_then_succeeds_with_growing_backoff,
    s_a3_retries_exhausted_keeps_last_error,
    s_a4_panic_and_timeout_are_retried_then_failed,
    s_a5_lease_lost_late_completion_changes_nothing,
    s_a6_two_runners_drain_without_running_twice,
    s_a7_dead_worker_does_not_stop_interval_series,
    s_a7_two_schedulers_make_each_occurrence_once,
    s_a8_unschedule_cancels_pending_only,
    s_a9_graceful_shutdown_finishes_in_flight,
    s_a9_shutdown_deadline_gives_leases_back_uncounted,
    s_a10_retention_prunes_old_finished_in_batches,
    s_a11_bad_input_is_named_and_harmless,
    runner_only_registered_hooks_leaves_others_pending,
    // Store API coverage
    store_bulk_enqueue_keeps_order_and_dedupes,
    store_query_filters_paging_and_order,
    store_next_scheduled_and_has_scheduled,
    store_heartbeat_extends_only_live_leases,
    store_snooze_and_release_do_not_use_attempts,
    store_cancel_running_fences_out_the_worker,
    store_operator_retry_requeues_failed,
    store_claim_order_priority_then_time,
    store_maintenance_lease_is_exclusive_until_expiry,
    store_fixed_delay_schedule_rearms_after_finish,
    store_schedule_upsert_by_name_is_idempotent,
    store_stats_counts_and_lag,
    store_logs_record_the_lifecycle,
);

//! The conformance suite: every scenario runs on every backend (SQLite always; PostgreSQL when
//! `DOCKHAND_TEST_POSTGRES_URL` is set; MySQL/MariaDB when `DOCKHAND_TEST_MYSQL_URL` is set).
//! Scenario ids from `shared/SCENARIOS.md` are in the test names (`s_a1_…`).

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
    store_finish_many_guards_each_row,
    // Item claims (S-C1 … S-C11)
    s_c1_two_pipelines_race_for_one_item,
    s_c2_takeover_fences_out_the_old_owner,
    s_c3_expired_claim_nobody_took_can_still_complete,
    s_c4_processed_item_reclaimed_when_reprocessing,
    s_c5_failing_handler_rolls_back_its_write,
    s_c6_completion_failure_downgrades_the_job,
    s_c7_second_handler_failure_undoes_both,
    s_c8_long_ids_sharing_a_prefix_are_independent,
    s_c9_legacy_claims_follow_the_job,
    s_c10_takeover_protects_the_new_owner,
    s_c11_reprocess_callback_sees_the_step_id,
    claims_for_a_final_job_are_given_back,
    // Terminal bridge (S-T1 … S-T4), engine data (S-B12), jobs
    s_t1_every_final_route_passes_the_bridge_once,
    s_t2_finishing_a_final_job_again,
    s_t3_crash_before_delivery_replays_once,
    s_t4_inline_continuation_carries_both_claims,
    s_b12_engine_data_compare_and_swap,
    jobs_park_resume_and_retries_keep_claims,
    r1_reaped_step_finishes_its_job_through_the_bridge,
    // Batches (S-B1 … S-B11)
    s_b1_twenty_five_packets_in_chunks_of_ten,
    s_b2_chunk_delivered_twice_makes_no_duplicates,
    s_b3_first_chunk_enqueue_fails,
    s_b4_later_chunk_enqueue_fails,
    s_b5_missing_and_corrupt_packets_are_discarded,
    s_b6_child_creation_fails_permanently,
    s_b7_cancel_a_batch_with_unscheduled_items,
    s_b8_aggregate_status,
    s_b9_parent_finish_fails_then_completes_once,
    s_b10_missing_fence_is_rearmed,
    s_b11_recover_stuck_completes_a_stranded_parent,
    // Failure routes through the fault-injection store
    fault_bridge_fails_before_then_retry_finishes_once,
    fault_bridge_commits_but_ack_lost,
    fault_step_advance_fails_then_advances_once,
    fault_completion_ack_lost_is_not_repeated,
    fault_claim_ack_lost_is_taken_over_after_ttl,
    fault_transient_finish_is_retried_in_process,
    // The fault-point sweep (RELIABILITY.md §1)
    sweep_fault_points,
);

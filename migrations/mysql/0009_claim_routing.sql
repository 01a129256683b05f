-- dockhand 0009: claim routing (issue 15, defect 12). On PostgreSQL this migration adds the
-- routing filter to the claim function; MySQL's claim statement carries it in the code
-- (src/store/mysql/claim.rs), so nothing changes in the schema here. Kept so that the
-- migration numbers mean the same change on every backend.
DO 0;

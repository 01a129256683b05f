-- dockhand 0015: item claims by token. A chunk hands each child the claims its worklist row
-- names by token, out of the parent's claims (a parent may hold every item of a batch):
-- without this index every hand-over scanned all the claims the parent still held.
CREATE INDEX dockhand_item_claims_token ON dockhand_item_claims (token);

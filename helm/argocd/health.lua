-- Argo CD health check for lakeslot.io/PostgresIngestion.
--
-- Argo CD runs it with the object as the global `obj` in a sandbox that offers only Lua's base
-- and table libraries: no string methods, no os or io (tests/test_argocd_health.py runs it in
-- exactly such a sandbox, Lua 5.1 like Argo CD's gopher-lua).
--
-- What the operator writes and this script reads: status.observedGeneration, status.phase and
-- status.conditions (metav1.Condition: type, status, reason, message, observedGeneration). The
-- Ready condition is the summary; when it is not True its reason is the first failing
-- condition's reason, so one table of reasons decides between waiting and acting.
--
--   Progressing  the operator has not seen the latest spec yet, or it is working (snapshot
--                running, reader or apply job starting), or the resource is being deleted
--   Healthy      Ready=True and nothing Degraded
--   Suspended    spec.suspend is true and the operator stopped the pipeline
--   Degraded     anything that needs someone to act: the Degraded condition (failed tables, WAL
--                at risk), a definite error (phase Failed), or any other reason Ready is not
--                True (the message carries the operator's fix)

-- Ready=False/Unknown reasons that waiting resolves. Every other reason is Degraded, so a
-- reason added to the operator later shows up rather than hides: among them a child that cannot
-- work (ChildRejected: the API server refused it; ReaderFailing: CrashLoopBackOff,
-- ImagePullBackOff or past its progress deadline; ApplyFailed: the apply SparkApplication is
-- FAILED or SUBMISSION_FAILED), which the operator also reports as Degraded.
local WAITING = {
  Reconciling = true,        -- the conditions are being computed for the first time
  Snapshotting = true,       -- the snapshot SparkApplication copies the tables
  WaitingForSnapshot = true, -- no table has a snapshot in Iceberg yet
  ReaderNotReady = true,     -- the reader Deployment has no available pod yet
  ApplyNotRunning = true,    -- the apply SparkApplication is being submitted or restarted
}

local function find(conditions, conditionType)
  if conditions == nil then
    return nil
  end
  for _, condition in ipairs(conditions) do
    if condition.type == conditionType then
      return condition
    end
  end
  return nil
end

local function describe(condition)
  if condition.message ~= nil and condition.message ~= "" then
    return condition.reason .. ": " .. condition.message
  end
  return condition.reason
end

local function health()
  local generation = tonumber(obj.metadata.generation) or 0
  local status = obj.status or {}
  local ready = find(status.conditions, "Ready")

  if obj.metadata.deletionTimestamp ~= nil then
    if ready ~= nil and ready.status == "False" and ready.reason == "CleanupBlocked" then
      return { status = "Degraded", message = describe(ready) }
    end
    return { status = "Progressing",
             message = "Deleting: dropping the slot and publication as the deletionPolicy says" }
  end

  local observed = tonumber(status.observedGeneration)
  local readyObserved = ready ~= nil and tonumber(ready.observedGeneration) or nil
  if observed == nil or observed < generation or ready == nil
      or (readyObserved ~= nil and readyObserved < generation) then
    return { status = "Progressing",
             message = "Waiting for the lakeslot operator to reconcile generation " .. tostring(generation) }
  end

  if ready.reason == "Suspended" then
    return { status = "Suspended", message = describe(ready) }
  end
  local degraded = find(status.conditions, "Degraded")
  if degraded ~= nil and degraded.status == "True" then
    return { status = "Degraded", message = describe(degraded) }
  end
  if ready.status == "True" then
    return { status = "Healthy", message = describe(ready) }
  end
  if status.phase ~= "Failed" and WAITING[ready.reason] then
    return { status = "Progressing", message = describe(ready) }
  end
  return { status = "Degraded", message = describe(ready) }
end

return health()

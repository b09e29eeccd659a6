-- Argo CD health check for serving.spyre.dev/SpyreModel, built on its status conditions.
--
--   no status, or status older than metadata.generation  -> Progressing
--   Degraded=True                                        -> Degraded
--   Progressing=True (compiling, rolling out)            -> Progressing
--   Ready=True (Serving, ScaledToZero)                   -> Healthy
--   Ready=False, reason a failure (PrecompileFailed, ...)-> Degraded
--   anything else (Compiling, RollingOut, PodsNotReady)  -> Progressing
--
-- Degraded wins over Ready=True: a model serving its previous artifact while the new spec
-- failed to compile (ServingPreviousArtifact + PrecompileFailed) still serves traffic, but
-- the desired state in Git is not realised. Tested by tests/unit/test_argocd_health.py.
local hs = {}

local failure_reasons = {
  PrecompileFailed = true,
  PrecompilePodRejected = true,
  ClaimNotFound = true,
  ClaimLost = true,
  EngineFailed = true,
  ImagePullFailed = true,
  ContainerConfigError = true,
  ClaimTerminating = true,
  ArtifactCorrupt = true,
  ArtifactMismatch = true,
  OutputMismatch = true,
  CanaryFailed = true,
  CanaryDeadlineExceeded = true,
  CanaryAborted = true,
  RolloutStalled = true,
  InvalidSpec = true,
  NameConflict = true,
  ClaimConflict = true,
  ClaimImmutable = true,
  ModelNotFound = true,
  ModelAccessDenied = true,
  ModelDownloadFailed = true,
  UnsupportedConfiguration = true,
  UnsupportedBase = true,
  InsufficientCacheSpace = true,
  EngineImageNotAllowed = true,
  SchedulerNotRunning = true,
  DeviceClassNotFound = true,
}

local function describe(c)
  local msg = c.type .. "=" .. tostring(c.status)
  if c.reason ~= nil and c.reason ~= "" then
    msg = msg .. " (" .. c.reason .. ")"
  end
  if c.message ~= nil and c.message ~= "" then
    msg = msg .. ": " .. c.message
  end
  return msg
end

if obj.status == nil or obj.status.conditions == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to report status"
  return hs
end

local generation = obj.metadata.generation
local observed = obj.status.observedGeneration
if generation ~= nil and (observed == nil or observed < generation) then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe generation " .. tostring(generation)
  return hs
end

local conditions = {}
for _, c in ipairs(obj.status.conditions) do
  if c.type ~= nil then
    conditions[c.type] = c
  end
end

-- A condition computed for an older generation says nothing about the current spec.
local function current(c)
  return c ~= nil and (generation == nil or c.observedGeneration == nil
    or c.observedGeneration >= generation)
end

local ready = conditions["Ready"]
local degraded = conditions["Degraded"]
local progressing = conditions["Progressing"]

if ready ~= nil and not current(ready) then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe generation " .. tostring(generation)
  return hs
end

if current(degraded) and degraded.status == "True" then
  hs.status = "Degraded"
  hs.message = describe(degraded)
  return hs
end

if current(progressing) and progressing.status == "True" then
  hs.status = "Progressing"
  hs.message = describe(progressing)
  return hs
end

if ready == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the Ready condition"
  return hs
end

if ready.status == "True" then
  hs.status = "Healthy"
  hs.message = describe(ready)
  return hs
end

if ready.status == "False" and failure_reasons[ready.reason] then
  hs.status = "Degraded"
else
  hs.status = "Progressing"
end
hs.message = describe(ready)
return hs

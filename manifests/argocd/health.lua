-- Argo CD health of a mmfleet.io/MultimodalInference, read from the status the operator writes
-- (mmfleet.status.compute_status). Argo CD runs this with `obj` set to the live resource and
-- expects a table with `status` and `message`. Only Lua's base library is loaded by default,
-- so this uses no string.* or os.* functions.
--
--   no status, or status.observedGeneration behind metadata.generation  -> Progressing
--   status.phase Failed (a spec the operator cannot serve)              -> Degraded
--   Degraded condition True (pods that cannot start, rollout stalled)   -> Degraded
--   RoutingReady False: its endpoint picker not ready yet               -> Progressing
--   RoutingReady False otherwise (its picker's pods failing: CrashLoopBackOff, an image not pulled;
--                  a CRD the routing mode needs missing)                -> Degraded
--   EncodeReady False: its encode replicas starting                      -> Progressing
--   EncodeReady False otherwise (an encode pod failing)                 -> Degraded
--   Ready condition True (every desired replica ready on the new spec)  -> Healthy
--   anything else (creating, rolling out, scaling)                      -> Progressing
--
-- Degraded is checked before Ready so a broken replica is never hidden behind a green app.
local hs = {}

if obj.status == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the mmfleet operator to report status"
  return hs
end

local generation = obj.metadata.generation
local observed = obj.status.observedGeneration
if observed == nil or (generation ~= nil and observed < generation) then
  hs.status = "Progressing"
  hs.message = "Waiting for the mmfleet operator to observe generation " .. tostring(generation)
  return hs
end

local ready = nil
local degraded = nil
local routing = nil
local encode = nil
if obj.status.conditions ~= nil then
  for _, condition in ipairs(obj.status.conditions) do
    if condition.type == "Ready" then
      ready = condition
    elseif condition.type == "Degraded" then
      degraded = condition
    elseif condition.type == "RoutingReady" then
      routing = condition
    elseif condition.type == "EncodeReady" then
      encode = condition
    end
  end
end

local function message(condition, fallback)
  if condition ~= nil and condition.message ~= nil and condition.message ~= "" then
    return condition.message
  end
  return fallback
end

if obj.status.phase == "Failed" then
  hs.status = "Degraded"
  hs.message = message(degraded, message(ready, "The spec cannot be served"))
  return hs
end

if degraded ~= nil and degraded.status == "True" then
  hs.status = "Degraded"
  hs.message = message(degraded, "Degraded")
  return hs
end

-- A part of the fleet beside its servers (the endpoint picker, the encode tier) that is not ready: Progressing while
-- it starts (`starting` is that reason), Degraded otherwise.
local function part(condition, starting, fallback)
  if condition == nil or condition.status ~= "False" then
    return nil
  end
  local found = {}
  if condition.reason == starting then
    found.status = "Progressing"
  else
    found.status = "Degraded"
  end
  found.message = message(condition, fallback)
  return found
end

local routed = part(routing, "PickerNotReady", "Routing not ready")
if routed ~= nil then
  return routed
end

local encoded = part(encode, "EncodeReplicasNotReady", "Encode tier not ready")
if encoded ~= nil then
  return encoded
end

if ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  hs.message = message(ready, "Ready")
  return hs
end

hs.status = "Progressing"
hs.message = message(ready, "Phase " .. tostring(obj.status.phase))
return hs

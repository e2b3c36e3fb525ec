// Validates Kubernetes objects against the schemas bundled in kubernetes-models (core, apps, autoscaling/v2),
// @kubernetes-models/prometheus-operator (PrometheusRule, PodMonitor, ServiceMonitor) and @kubernetes-models/keda
// (ScaledObject), offline.
// Input: a JSON array of objects on stdin. Output: one JSON line per object, {kind, name, errors}; exit 1 if any fails.
import { readFileSync } from "node:fs";
import * as core from "kubernetes-models/v1";
import * as apps from "kubernetes-models/apps/v1";
import * as autoscaling from "kubernetes-models/autoscaling/v2";
import * as monitoring from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1";
import * as keda from "@kubernetes-models/keda/keda.sh/v1alpha1";

const models = {
  "v1": core,
  "apps/v1": apps,
  "autoscaling/v2": autoscaling,
  "monitoring.coreos.com/v1": monitoring,
  "keda.sh/v1alpha1": keda,
};

let failed = false;
for (const object of JSON.parse(readFileSync(0, "utf8"))) {
  const Model = models[object.apiVersion]?.[object.kind];
  let errors = [];
  if (!Model) {
    errors = [`no schema for ${object.apiVersion} ${object.kind}`];
  } else {
    try {
      new Model(object).validate();
    } catch (error) {
      errors = (error.errors ?? [error]).map((e) => e.instancePath !== undefined ? `${e.instancePath || "/"} ${e.message}` : String(e.message ?? e));
    }
  }
  failed ||= errors.length > 0;
  console.log(JSON.stringify({ kind: object.kind, name: object.metadata?.name, errors }));
}
process.exit(failed ? 1 : 0);

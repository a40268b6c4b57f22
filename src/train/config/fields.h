// The keys of every section of the configuration, as tables of fields (schema.h): the one list
// that reading, --set, suggestions for unknown keys and the writer use.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "train/config.h"
#include "train/config/schema.h"

namespace hetra::train::cfg {

const Fields<ModelConfig>& modelFields();
const Fields<DataConfig>& dataFields();
const Fields<TrainConfig>& trainFields();
const Fields<BalanceConfig>& balanceFields();
const Fields<CommConfig>& commFields();
const Fields<ElasticConfig>& elasticFields();
const Fields<TopologyConfig>& topologyFields();
const Fields<LaunchConfig>& launchFields();
const Fields<ParallelConfig>& parallelFields();
const Fields<ZeroConfig>& zeroFields();
const Fields<DeviceConfig>& deviceFields();  // one [[devices]] entry

// Calls fn(name, member, fields) for each table section of RunConfig, in the order toToml writes
// them: the one list of sections that reading, --set, suggestions and the writer walk.
// [[devices]] is a list of tables, handled apart.
template <class Fn>
void forEachSection(Fn&& fn) {
  fn("model", &RunConfig::model, modelFields());
  fn("data", &RunConfig::data, dataFields());
  fn("train", &RunConfig::train, trainFields());
  fn("balance", &RunConfig::balance, balanceFields());
  fn("comm", &RunConfig::comm, commFields());
  fn("elastic", &RunConfig::elastic, elasticFields());
  fn("topology", &RunConfig::topology, topologyFields());
  fn("launch", &RunConfig::launch, launchFields());
  fn("parallel", &RunConfig::parallel, parallelFields());
  fn("zero", &RunConfig::zero, zeroFields());
}

// The top-level names of the file: the table sections, then "devices".
const std::vector<std::string>& sectionNames();

template <class S>
std::vector<std::string> keysOf(const Fields<S>& fields) {
  std::vector<std::string> keys;
  for (const auto& f : fields) keys.push_back(f.key);
  return keys;
}

// Every known key as (leaf, "section.leaf"), devices as "devices[i].leaf", for suggestions across
// sections.
std::vector<std::pair<std::string, std::string>> allKeys();

// "did you mean ...?" for an unknown `leaf` among `known` leaves; else the same leaf in another
// section (lr at the top level -> train.lr); else the list of known keys of `where`.
std::string suggestion(const std::string& leaf, const std::vector<std::string>& known,
                       const std::string& prefix, const std::string& where);

// Whether the key ({section, leaf} or {devices, i, leaf}) names a string setting, whose --set
// value is then taken verbatim when it is not quoted.
bool isTextKey(const std::vector<std::string>& path);

}  // namespace hetra::train::cfg
